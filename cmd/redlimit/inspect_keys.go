package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// This file holds inspect and reset of the keys of a Policy (-rule, all its
// rules at once) and of a Concurrency (-concurrency): their state shown in
// human terms, as the library's own calls read it.

// ruleList is the -rule flag: the rules of a Policy, one a flag.
type ruleList []redlimit.Rule

func (l *ruleList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, r := range *l {
		s[i] = fmt.Sprintf("%s=%v:%v", r.Name, r.Strategy, r.Limit)
	}
	return strings.Join(s, ",")
}

// ruleSyntax is the form of a -rule.
const ruleSyntax = "NAME=STRATEGY:RATE/PERIOD[:BURST][:warmup=D], PERIOD a duration or a calendar's day, week[-WEEKDAY] or month[-DAY], then [@ZONE]; a sub-window-counter's BURST is its sub-windows"

// Set parses NAME=STRATEGY:RATE/PERIOD[:BURST][:warmup=D], such as
// tokens=token-bucket:100/1m or rps=token-bucket:10/1s:warmup=30s; PERIOD
// may be a calendar instead (see calendarPeriod): daily=fixed-window:
// 1000/day@Asia/Tokyo. For a sub-window counter the third part is its
// sub-windows (hour=sub-window-counter:1000/1h:60).
func (l *ruleList) Set(s string) error {
	bad := fmt.Errorf("rule %q: want %s, such as tokens=token-bucket:100/1m or daily=fixed-window:1000/day@Asia/Tokyo", s, ruleSyntax)
	name, spec, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return bad
	}
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || len(parts) > 4 {
		return bad
	}
	st, err := redlimit.ParseStrategy(parts[0])
	if err != nil {
		return fmt.Errorf("rule %q: unknown strategy %q (want %s)", s, parts[0], strategyList(false))
	}
	rate, period, ok := strings.Cut(parts[1], "/")
	if !ok {
		return bad
	}
	n, err := strconv.Atoi(rate)
	if err != nil {
		return bad
	}
	lim, isCal, err := calendarPeriod(n, period)
	if err != nil {
		return fmt.Errorf("rule %q: %v", s, err)
	}
	if !isCal {
		lim = redlimit.Limit{Rate: n}
		if lim.Period, err = time.ParseDuration(period); err != nil {
			return bad
		}
	}
	if err := ruleExtras(s, st, &lim, isCal, parts[2:], bad); err != nil {
		return err
	}
	*l = append(*l, redlimit.Rule{Name: name, Strategy: st, Limit: lim})
	return nil
}

// ruleExtras reads the parts of the -rule s after RATE/PERIOD into lim:
// [BURST][:warmup=D], BURST being the sub-windows of a sub-window counter
// (st). A calendar quota (isCal) takes neither; bad is the error of a part
// out of that form.
func ruleExtras(s string, st redlimit.Strategy, lim *redlimit.Limit, isCal bool, parts []string, bad error) error {
	burst := false
	var err error
	for _, p := range parts {
		switch v, warm := strings.CutPrefix(p, "warmup="); {
		case isCal:
			return fmt.Errorf("rule %q: a calendar quota takes no BURST or warm-up", s)
		case warm && lim.WarmUp == 0:
			if lim.WarmUp, err = time.ParseDuration(v); err != nil || lim.WarmUp <= 0 {
				return fmt.Errorf("rule %q: warmup=%q: want a positive duration, such as warmup=30s", s, v)
			}
		case !warm && !burst && lim.WarmUp == 0:
			third := &lim.Burst
			if st == redlimit.SubWindowCounter {
				third = &lim.SubWindows
			}
			if *third, err = strconv.Atoi(p); err != nil {
				return bad
			}
			burst = true
		default:
			return bad
		}
	}
	return nil
}

// otherKeyFlags are the flags that select a Policy's or a Concurrency's
// keys instead of one limiter's.
type otherKeyFlags struct {
	rules       ruleList
	concurrency bool
	max         int
}

func (o *otherKeyFlags) register(fs *flag.FlagSet, inspect bool) {
	fs.Var(&o.rules, "rule", "a Policy's `rule` "+ruleSyntax+", one -rule per rule, instead of -strategy (such as -rule requests=sliding-counter:10/1s -rule tokens=token-bucket:100/1m -rule daily=fixed-window:1000/day@Asia/Tokyo)")
	fs.BoolVar(&o.concurrency, "concurrency", false, "a Concurrency's key (its leases) instead of a limiter's")
	if inspect {
		fs.IntVar(&o.max, "max", 0, "with -concurrency: the limit's max, to show the free slots (0: not shown)")
	}
}

// mode returns "policy", "concurrency" or "" (one limiter), or a usage
// error for flags that do not go together.
func (o *otherKeyFlags) mode(cmd string, f *keyFlags) (string, error) {
	switch {
	case len(o.rules) > 0 && o.concurrency:
		return "", usagef(cmd, "-rule and -concurrency do not go together")
	case (len(o.rules) > 0 || o.concurrency) && (f.strategy.s != 0 || f.period != 0 || f.warmup != 0 || f.cal.calendar != ""):
		return "", usagef(cmd, "-strategy, -period, -calendar and -warmup name one limiter's key; -rule and -concurrency replace them")
	case o.max != 0 && !o.concurrency:
		return "", usagef(cmd, "-max is for -concurrency")
	case o.max < 0:
		return "", usagef(cmd, "-max %d must be positive", o.max)
	case len(o.rules) > 0:
		return "policy", nil
	case o.concurrency:
		return "concurrency", nil
	}
	return "", nil
}

// policyKeys returns the Redis keys of key for a Policy of rules: each
// rule's state and pending reservations, and the policy's penalty block,
// kept beside the state of the rule whose key sorts first.
func policyKeys(prefix string, rules []redlimit.Rule, key string) (states []string, block string, reservations []string) {
	first := ""
	for _, r := range rules {
		s := limitStateKey(prefix, r.Strategy, r.Limit, key)
		states = append(states, s)
		reservations = append(reservations, s+reserveSuffix)
		if first == "" || s < first {
			first = s
		}
	}
	return states, first + blockSuffix, reservations
}

// inspectPolicy prints the policy's decision for n = 0, then each rule's
// state in human terms, as a limiter of that rule alone reads it (a rule's
// state key is the same as that limiter's).
func inspectPolicy(ctx context.Context, rdb *redis.Client, p *redlimit.Policy, prefix, key string, w io.Writer) error {
	rules := p.Rules()
	states, block, reservations := policyKeys(prefix, rules, key)
	res, err := p.AllowN(ctx, key, 0)
	if err != nil {
		return err
	}
	blockTTL, err := rdb.PTTL(ctx, block).Result()
	if err != nil {
		return fmt.Errorf("inspect %q: %w", block, err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "key\t%q\n", key)
	fmt.Fprintf(tw, "policy\t%s\n", plural(len(rules), "rule"))
	fmt.Fprintf(tw, "allowed\t%v\n", res.Allowed)
	fmt.Fprintf(tw, "remaining\t%d (rule %s)\n", res.Remaining, res.Rule)
	if blockTTL > 0 {
		fmt.Fprintf(tw, "blocked\tfor %v more: every call asking for events is denied\n", blockTTL)
	} else {
		fmt.Fprintf(tw, "blocked\tno\n")
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "rule\tstrategy\tlimit\tstate")
	for _, r := range rules {
		lim, err := newLimiter(rdb, r.Strategy, r.Limit, redlimit.WithPrefix(prefix))
		if err != nil {
			return err
		}
		rr, err := lim.AllowN(ctx, key, 0)
		if err := errors.Join(err, lim.Close()); err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%s\n", r.Name, r.Strategy, rr.Limit, humanState(r.Strategy, rr))
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "redis key\ttype\tttl\tvalue")
	for _, k := range append(append(states, block), reservations...) {
		typ, ttl, val, err := describeKey(ctx, rdb, k)
		if err != nil {
			return fmt.Errorf("inspect %q: %w", k, err)
		}
		fmt.Fprintf(tw, "%q\t%s\t%s\t%s\n", k, typ, ttl, val)
	}
	return tw.Flush()
}

// humanState says what a decision for n = 0 reports of a rule's state: the
// events used of its allowance and when it is full again, in the words of
// the strategy.
func humanState(s redlimit.Strategy, res redlimit.Result) string {
	capacity := res.Limit.Burst
	if capacity == 0 {
		capacity = res.Limit.Rate
	}
	used := max(capacity-res.Remaining, 0)
	full := "full"
	if res.ResetAfter > 0 {
		full = "full in " + res.ResetAfter.String()
	}
	switch s {
	case redlimit.TokenBucket:
		return fmt.Sprintf("%d of %d tokens used, %d left; %s", used, capacity, res.Remaining, full)
	case redlimit.LeakyBucket:
		return fmt.Sprintf("%d of %d queued, %d free; %s", used, capacity, res.Remaining, strings.Replace(full, "full", "empty", 1))
	case redlimit.FixedWindow:
		if used == 0 {
			return fmt.Sprintf("0 of %d counted in this window", capacity)
		}
		return fmt.Sprintf("%d of %d counted in this window, which ends in %v", used, capacity, res.ResetAfter)
	case redlimit.SubWindowCounter:
		return fmt.Sprintf("%d of %d counted in the last %v and up to one sub-window (of %d) before; %s",
			used, capacity, res.Limit.Period, res.Limit.SubWindows, full)
	}
	return fmt.Sprintf("%d of %d counted in the last %v; %s", used, capacity, res.Limit.Period, full)
}

// concurrencyKey returns the Redis key of key's leases for a Concurrency
// with prefix: "<prefix>:{<tag>}:cc".
func concurrencyKey(prefix, key string) string {
	return prefix + ":{" + tagKey(key) + "}:cc"
}

// inspectConcurrency prints the leases of key: each holder (the lease's
// id) and when its lease expires, on the server's clock (a Concurrency with
// WithClientClock writes expiries on its clients' clocks, which may
// disagree with it by their skew), and, when slots (the Concurrency's max)
// is given, how many of them are free.
func inspectConcurrency(ctx context.Context, rdb *redis.Client, prefix, key string, slots int, w io.Writer) error {
	k := concurrencyKey(prefix, key)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("inspect %q: %w", k, err)
	}
	leases, err := rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
	if err != nil {
		return fmt.Errorf("inspect %q: %w", k, err)
	}
	nowUS := now.UnixMicro()
	live := 0
	for _, l := range leases {
		if int64(l.Score) > nowUS {
			live++
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "key\t%q\n", key)
	held := plural(live, "lease") + " held"
	if slots > 0 {
		held += fmt.Sprintf(", %d of %d slots free", max(slots-live, 0), slots)
	}
	fmt.Fprintf(tw, "leases\t%s\n", held)
	fmt.Fprintf(tw, "stored in\t%q\n", k)
	tw.Flush()
	if len(leases) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "holder (lease id)\texpires")
	for _, l := range leases {
		in := time.Duration(int64(l.Score)-nowUS) * time.Microsecond
		when := "in " + in.String()
		if in <= 0 {
			when = "expired " + (-in).String() + " ago (not counted; removed by a later call)"
		}
		fmt.Fprintf(tw, "%q\t%s\n", fmt.Sprint(l.Member), when)
	}
	return tw.Flush()
}

// resetFound deletes key's state by calling reset, and prints which of
// keys held state before; named are the keys shown when none did.
func resetFound(ctx context.Context, rdb *redis.Client, key string, keys, named []string, reset func() error, w io.Writer) error {
	var found []string
	for _, k := range keys {
		n, err := rdb.Exists(ctx, k).Result()
		if err != nil {
			return fmt.Errorf("reset %q: %w", key, err)
		}
		if n > 0 {
			found = append(found, k)
		}
	}
	if err := reset(); err != nil {
		return err
	}
	if len(found) == 0 {
		fmt.Fprintf(w, "reset %q: no state in Redis (%s)\n", key, quoteAll(named))
	} else {
		fmt.Fprintf(w, "reset %q: deleted %s\n", key, quoteAll(found))
	}
	return nil
}

// runOther runs inspect or reset (cmd) for a Policy's or a Concurrency's
// key, as mode says.
func runOther(ctx context.Context, cmd, mode string, f *keyFlags, o *otherKeyFlags, key string, w io.Writer) error {
	if mode == "policy" {
		// The policy has a penalty block, so that its decision reads the
		// key's block (see keyFlags.connect).
		opts := []redlimit.Option{redlimit.WithPrefix(f.prefix), redlimit.WithBlock(time.Second), redlimit.WithFallback(redlimit.FallbackError)}
		rdb, p, err := connectWith(ctx, f, func(rdb redis.UniversalClient) (*redlimit.Policy, error) {
			return redlimit.NewPolicy(rdb, o.rules, opts...)
		})
		if err != nil {
			return err
		}
		defer rdb.Close()
		if cmd == "inspect" {
			return errors.Join(inspectPolicy(ctx, rdb, p, f.prefix, key, w), p.Close())
		}
		states, block, reservations := policyKeys(f.prefix, o.rules, key)
		keys := append(append(states, block), reservations...)
		err = resetFound(ctx, rdb, key, keys, keys, func() error { return p.Reset(ctx, key) }, w)
		return errors.Join(err, p.Close())
	}
	rdb, err := f.dial(ctx)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if cmd == "inspect" {
		return inspectConcurrency(ctx, rdb, f.prefix, key, o.max, w)
	}
	k := concurrencyKey(f.prefix, key)
	return resetFound(ctx, rdb, key, []string{k}, []string{k}, func() error {
		if err := rdb.Del(ctx, k).Err(); err != nil {
			return fmt.Errorf("reset %q: %w", key, err)
		}
		return nil
	}, w)
}
