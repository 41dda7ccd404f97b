package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

var inspectCmd = &command{
	name:  "inspect",
	args:  "-redis ADDR (-strategy S -rate R (-period P [-warmup W] [-subwindows W] | -calendar C [-zone Z] [-first F]) [-burst B] | -rule R... | -concurrency [-max M]) [-prefix P] KEY",
	short: "show the decision and the Redis keys of one limited key",
	long: `
Inspect shows what a limiter with the given strategy and limit would decide
for KEY now, without consuming anything (AllowN with n = 0): allowed,
remaining, retry-after and reset-after (and the delay of a leaky bucket),
and whether a penalty block (WithBlock) is in force: then every call that
asks for events is denied for the time that blocked shows, and remaining
is 0 and reset-after that time, as the limiter itself reports them for
n = 0. Then it lists the Redis keys that hold KEY's state, with their type,
time to live and value:

	<prefix>:{<KEY>}:<code><period in µs>     the state
	<prefix>:{<KEY>}:<code><period in µs>:b   the penalty block (WithBlock)
	<prefix>:{<KEY>}:<code><period in µs>:r   the pending reservations
	                                         (Reserve, and prefetches)

where '%', '{' and '}' in KEY are written %25, %7B and %7D, and code is fw,
sl, sc, tb, lb or sw for fixed-window, sliding-log, sliding-counter,
token-bucket, leaky-bucket and sub-window-counter. For example
redlimit:{user1}:tb1000000. A sub-window counter's state names its
sub-windows (-subwindows, 0 for the default) after the period: for
example redlimit:{user1}:sw3600000000x60, a hash of its counts. A
KEY longer than 256 bytes (before that escaping) appears hashed: in its
place is %h and the SHA-256 of KEY in hex, 66 bytes in all.

A Policy's key: give its rules with -rule (one each, NAME=STRATEGY:
RATE/PERIOD[:BURST][:warmup=D], such as -rule tokens=token-bucket:100/1m or
-rule hour=sub-window-counter:1000/1h:60 (a sub-window counter's third part
is its sub-windows) or
-rule rps=token-bucket:10/1s:warmup=30s; PERIOD can be a calendar's day,
week[-WEEKDAY] or month[-DAY], then @ZONE, as -calendar, -first and -zone
say: -rule daily=fixed-window:1000/day@Asia/Tokyo, -rule
billing=fixed-window:10000/month-31@America/New_York) instead of
-strategy, -rate and -period. Inspect shows the policy's decision, its
penalty block, and each rule's state in human terms: tokens used and when
the bucket is full, the window's count and when it ends, the events counted
in a sliding period. A rule's state key is the one a limiter of that rule
alone would use.

A Concurrency's key: -concurrency (and -max, to show the free slots).
Inspect lists the leases of KEY (<prefix>:{<KEY>}:cc, a sorted set): each
holder, by its lease id, and when its lease expires on the server's clock
(with WithClientClock, on its clients' clocks: off by their skew).

With -calendar day, week or month (and -zone, -first), the limit is a
calendar quota of a fixed-window limiter (redlimit.Daily, Weekly,
Monthly): inspect also shows its window, the one that holds the server's
time, as local start and end, and its keys name the calendar instead of a
period: <prefix>:{<KEY>}:cw-daily-Asia/Tokyo, cw-weekly-1-UTC (from
Monday), cw-monthly-31-America/New_York.

With -warmup (Limit.WarmUp), the limit is a warming token or leaky bucket,
whose state is apart, under the code wt or wl: <prefix>:{<KEY>}:wt1000000.
Without it, inspect reads the key of a bucket without a warm-up.

KEY and the Redis keys are printed quoted, as Go strings ("user1"), so that
a newline or a terminal escape sequence in a key shows as \n or \x1b
instead of forging or hiding output.`,
	setup: setupInspect,
}

var resetCmd = &command{
	name:  "reset",
	args:  "-redis ADDR (-strategy S (-period P [-warmup W] [-subwindows W] | -calendar C [-zone Z] [-first F]) | -rule R... | -concurrency) [-prefix P] KEY",
	short: "forget the state of one limited key",
	long: `
Reset deletes the Redis keys that hold KEY's state for a limiter of the
given strategy and period, as the limiter's Reset method does: its state,
its penalty block and its pending reservations (see inspect). KEY starts
again with its full allowance. The rate does not matter, since it is not
part of the key names. A calendar quota's keys (-calendar, -zone, -first)
and a warming bucket's (-warmup) are apart from those of -period alone:
name them as inspect does.

With -rule (a Policy's rules, as for inspect) it deletes every rule's
state and reservations and the policy's block, as Policy.Reset does; with
-concurrency, the key's leases (every holder's slot is free again; a
holder's Release later finds no lease).

Reset prints KEY and the Redis keys it deleted quoted, as Go strings, as
inspect does.`,
	setup: setupReset,
}

// keyFlags are the flags that name a limited key's state in Redis.
type keyFlags struct {
	addr     string
	strategy strategyValue
	period   time.Duration
	warmup   time.Duration
	sub      int // -subwindows: a sub-window counter's Limit.SubWindows
	prefix   string
	timeout  time.Duration
	cal      calendarFlags
}

func (f *keyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "redis", "", "`address` of the Redis server, host:port (required)")
	fs.Var(&f.strategy, "strategy", "the limiter's `strategy`: "+strategyList(false)+" (required)")
	fs.DurationVar(&f.period, "period", 0, "the limit's period (required, unless -calendar)")
	fs.DurationVar(&f.warmup, "warmup", 0, "the limit's warm-up (Limit.WarmUp: token-bucket and leaky-bucket), whose keys are apart")
	fs.IntVar(&f.sub, "subwindows", 0, "sub-windows per period of sub-window-counter (0 means 60, or one per whole ms under 60ms)")
	f.cal.register(fs)
	fs.StringVar(&f.prefix, "prefix", "redlimit", "the limiter's key prefix (WithPrefix)")
	fs.DurationVar(&f.timeout, "timeout", defaultTimeout, fmt.Sprintf("read and write timeout of each Redis command, at most %v", maxBenchTimeout))
}

// check checks the flags and the single KEY argument, and returns the key.
// limiter says whether -strategy and -period name the key (they do unless
// -rule or -concurrency is given): they are required then.
func (f *keyFlags) check(cmd string, args []string, limiter bool) (string, error) {
	switch {
	case f.timeout <= 0 || f.timeout > maxBenchTimeout:
		return "", usagef(cmd, "-timeout %v must be positive and at most %v", f.timeout, maxBenchTimeout)
	case f.addr == "":
		return "", usagef(cmd, "-redis is required")
	case limiter && f.strategy.s == 0:
		return "", usagef(cmd, "-strategy is required")
	case limiter && f.period == 0:
		return "", usagef(cmd, "-period is required")
	case len(args) == 0:
		return "", usagef(cmd, "missing KEY")
	case len(args) > 1:
		return "", usagef(cmd, "want one KEY, got %d arguments", len(args))
	case args[0] == "":
		return "", usagef(cmd, "empty KEY")
	}
	return args[0], nil
}

// limit returns the limit that the flags describe, of rate and burst: a
// calendar quota (-calendar; -period is then the calendar's nominal one,
// which names no key), or one of -period, with -warmup. Only its key names
// matter to reset, which passes rate 1.
func (f *keyFlags) limit(cmd string, rate, burst int) (redlimit.Limit, error) {
	limit, isCal, err := f.cal.limit(cmd, rate)
	switch {
	case err != nil:
		return limit, err
	case !isCal:
		return redlimit.Limit{Rate: rate, Period: f.period, Burst: burst, WarmUp: f.warmup, SubWindows: f.sub}, nil
	case f.period != 0:
		return limit, usagef(cmd, "-period and -calendar do not go together")
	case f.warmup != 0 || burst != 0 || f.sub != 0:
		return limit, usagef(cmd, "a calendar quota (-calendar) takes no -burst, -warmup or -subwindows")
	}
	f.period = limit.Period
	return limit, nil
}

// connect returns a client for f.addr that answered a ping, and a limiter
// of f's strategy with limit. A bad limit or prefix fails before any
// network traffic.
//
// The limiter has a penalty block (WithBlock), so that its decisions read
// the key's block as the limiter that set it does: without one, inspect
// showed a blocked key's limit alone (allowed, 2 remaining) while every
// call was denied. Its length does not matter: only a denial sets a
// block, and inspect asks for n = 0, which is never denied, and reset
// decides nothing.
func (f *keyFlags) connect(ctx context.Context, limit redlimit.Limit) (*redis.Client, *redlimit.RateLimiter, error) {
	return connectWith(ctx, f, func(rdb redis.UniversalClient) (*redlimit.RateLimiter, error) {
		return newLimiter(rdb, f.strategy.s, limit, redlimit.WithPrefix(f.prefix), redlimit.WithBlock(time.Second))
	})
}

// dial returns a client for f.addr that answered a ping.
func (f *keyFlags) dial(ctx context.Context) (*redis.Client, error) {
	rdb := newClient(f.addr, 2, f.timeout)
	if err := ping(ctx, rdb); err != nil {
		rdb.Close()
		return nil, err
	}
	return rdb, nil
}

// connectWith returns a client for f.addr that answered a ping, and the
// limiter that open makes with it. open is first given a client that is
// never used (see checkWith), so that a bad limit, rule or prefix fails
// before any network traffic.
func connectWith[L io.Closer](ctx context.Context, f *keyFlags, open func(redis.UniversalClient) (L, error)) (*redis.Client, L, error) {
	var none L
	if err := checkWith(open); err != nil {
		return nil, none, err
	}
	rdb, err := f.dial(ctx)
	if err != nil {
		return nil, none, err
	}
	lim, err := open(rdb)
	if err != nil {
		rdb.Close()
		return nil, none, err
	}
	return rdb, lim, nil
}

func setupInspect(fs *flag.FlagSet) runFunc {
	var f keyFlags
	f.register(fs)
	var rate, burst int
	fs.IntVar(&rate, "rate", 0, "the limit's rate, events per period (required)")
	fs.IntVar(&burst, "burst", 0, "the limit's burst for token-bucket and leaky-bucket (0 means -rate)")
	var o otherKeyFlags
	o.register(fs, true)
	return func(ctx context.Context, args []string, stdout, _ io.Writer) error {
		mode, err := o.mode("inspect", &f)
		if err != nil {
			return err
		}
		if mode != "" {
			if rate != 0 || burst != 0 {
				return usagef("inspect", "-rate and -burst are one limiter's; a -rule has its own")
			}
			key, err := f.check("inspect", args, false)
			if err != nil {
				return err
			}
			return runOther(ctx, "inspect", mode, &f, &o, key, stdout)
		}
		limit, err := f.limit("inspect", rate, burst)
		if err != nil {
			return err
		}
		key, err := f.check("inspect", args, true)
		if err != nil {
			return err
		}
		if rate == 0 {
			return usagef("inspect", "-rate is required")
		}
		rdb, lim, err := f.connect(ctx, limit)
		if err != nil {
			return err
		}
		defer rdb.Close()
		return errors.Join(inspect(ctx, rdb, lim, f.prefix, key, stdout), lim.Close())
	}
}

// inspect prints the decision for n = 0 and the Redis keys of key. lim
// must have a penalty block (see connect), so that the decision reads the
// key's block.
func inspect(ctx context.Context, rdb *redis.Client, lim *redlimit.RateLimiter, prefix, key string, w io.Writer) error {
	keys := limitStateKeys(prefix, lim.Strategy(), lim.Limit(), key)
	res, err := lim.AllowN(ctx, key, 0)
	if err != nil {
		return err
	}
	// A calendar limit's window: the one that holds the server's time, as
	// the decision's does.
	var window string
	if _, _, ok := lim.Limit().Window(time.Time{}); ok {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			return fmt.Errorf("inspect: TIME: %w", err)
		}
		start, end, _ := lim.Limit().Window(now)
		window = start.Format(time.RFC3339) + " to " + end.Format(time.RFC3339) + " (" + end.Sub(start).String() + ")"
	}
	// While a block is in force, n = 0 reports it as reset-after: the
	// retry-after every call that asks for events is denied with. (The
	// block key is read after the decision: one that ends in between
	// shows as none, one set in between with the limit's reset-after.)
	blocked, err := rdb.Exists(ctx, keys[1]).Result()
	if err != nil {
		return fmt.Errorf("inspect %q: %w", keys[1], err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "key\t%q\n", key)
	fmt.Fprintf(tw, "strategy\t%v\n", lim.Strategy())
	fmt.Fprintf(tw, "limit\t%v\n", res.Limit)
	if window != "" {
		fmt.Fprintf(tw, "window\t%s\n", window)
	}
	fmt.Fprintf(tw, "allowed\t%v\n", res.Allowed)
	fmt.Fprintf(tw, "remaining\t%d\n", res.Remaining)
	fmt.Fprintf(tw, "retry-after\t%v\n", res.RetryAfter)
	fmt.Fprintf(tw, "reset-after\t%v\n", res.ResetAfter)
	if lim.Strategy() == redlimit.LeakyBucket {
		fmt.Fprintf(tw, "delay\t%v\n", res.Delay)
	}
	if blocked > 0 {
		fmt.Fprintf(tw, "blocked\t%v\n", res.ResetAfter)
	} else {
		fmt.Fprintf(tw, "blocked\tno\n")
	}
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "redis key\ttype\tttl\tvalue")
	for _, k := range keys {
		typ, ttl, val, err := describeKey(ctx, rdb, k)
		if err != nil {
			return fmt.Errorf("inspect %q: %w", k, err)
		}
		fmt.Fprintf(tw, "%q\t%s\t%s\t%s\n", k, typ, ttl, val)
	}
	return tw.Flush()
}

// describeKey returns the type, time to live and a short form of the value
// of the Redis key k.
func describeKey(ctx context.Context, rdb *redis.Client, k string) (typ, ttl, val string, err error) {
	if typ, err = rdb.Type(ctx, k).Result(); err != nil {
		return "", "", "", err
	}
	if typ == "none" {
		return "(missing)", "-", "-", nil
	}
	pttl, err := rdb.PTTL(ctx, k).Result()
	if err != nil {
		return "", "", "", err
	}
	ttl = fmtTTL(pttl)
	switch typ {
	case "string":
		val, err = rdb.Get(ctx, k).Result()
	case "hash":
		var h map[string]string
		h, err = rdb.HGetAll(ctx, k).Result()
		val = fmtHash(h)
	case "zset":
		var n int64
		n, err = rdb.ZCard(ctx, k).Result()
		val = fmt.Sprintf("%d members", n)
	}
	if errors.Is(err, redis.Nil) { // expired between the calls
		return "(missing)", "-", "-", nil
	}
	return typ, ttl, val, err
}

// fmtTTL formats a PTTL reply, which go-redis returns as -1 (no expiry) or
// -2 (no key) nanoseconds for those cases.
func fmtTTL(d time.Duration) string {
	switch {
	case d == -1:
		return "none"
	case d < 0:
		return "-"
	}
	return d.String()
}

// fmtHash formats a hash as "f1=v1 f2=v2", fields sorted.
func fmtHash(h map[string]string) string {
	fields := make([]string, 0, len(h))
	for f := range h {
		fields = append(fields, f)
	}
	slices.Sort(fields)
	for i, f := range fields {
		fields[i] = f + "=" + h[f]
	}
	return strings.Join(fields, " ")
}

func setupReset(fs *flag.FlagSet) runFunc {
	var f keyFlags
	f.register(fs)
	var o otherKeyFlags
	o.register(fs, false)
	return func(ctx context.Context, args []string, stdout, _ io.Writer) error {
		mode, err := o.mode("reset", &f)
		if err != nil {
			return err
		}
		if mode != "" {
			key, err := f.check("reset", args, false)
			if err != nil {
				return err
			}
			return runOther(ctx, "reset", mode, &f, &o, key, stdout)
		}
		// The rate is not part of the key names; any valid one will do.
		limit, err := f.limit("reset", 1, 0)
		if err != nil {
			return err
		}
		key, err := f.check("reset", args, true)
		if err != nil {
			return err
		}
		rdb, lim, err := f.connect(ctx, limit)
		if err != nil {
			return err
		}
		defer rdb.Close()
		keys := limitStateKeys(f.prefix, f.strategy.s, limit, key)
		err = resetFound(ctx, rdb, key, keys, keys[:1], func() error { return lim.Reset(ctx, key) }, stdout)
		return errors.Join(err, lim.Close())
	}
}

// quoteAll returns keys quoted as Go strings (strconv.Quote), joined by
// ", ". Keys are quoted wherever they are printed, so that one with a
// newline or a terminal escape sequence cannot forge or hide output.
func quoteAll(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = strconv.Quote(k)
	}
	return strings.Join(q, ", ")
}
