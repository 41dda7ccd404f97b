// Package ratelimitfields describes the decisions of a redlimit.Limiter in
// the fields of the IETF draft draft-ietf-httpapi-ratelimit-headers, for
// the middleware of this module: httplimit's RateLimit-Policy header field
// and grpclimit's ratelimit-policy metadata list the same quota policies,
// with the same names, q and w, in the same order, and name the same one
// as the one that decided. Only packages under github.com/redlimit/redlimit
// can import it; it is no part of the API.
//
// httplimit.Quota documents q and w; this package computes them.
package ratelimitfields

import (
	"context"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/callrules"
)

// MaxInteger is the largest Structured Field Integer (RFC 9651, section
// 3.3.1).
const MaxInteger = 999_999_999_999_999

// Quota returns the quota policy for a limit l of strategy s: q events in
// a window of w seconds; ok is false when l has no positive Rate and
// Period, or q does not fit a Structured Field Integer. See httplimit.Quota,
// which is this function, for the rules.
func Quota(s redlimit.Strategy, l redlimit.Limit) (q, w int64, ok bool) {
	if l.Rate <= 0 || l.Period <= 0 {
		return 0, 0, false
	}
	capacity := l.Rate
	switch s {
	case redlimit.FixedWindow, redlimit.SlidingLog, redlimit.SlidingCounter, redlimit.SubWindowCounter:
	case redlimit.TokenBucket, redlimit.LeakyBucket:
		if l.Burst > 0 {
			capacity = l.Burst
		}
	default:
		capacity = max(l.Rate, l.Burst)
	}
	// w = ceil(capacity × Period / (Rate × 1s)), the span rounded up to
	// whole seconds exactly, so that Rate × w × 1s >= capacity × Period
	// and q >= capacity. (The span rounded down to whole nanoseconds
	// first lost that: Burst 244609 at 1002 per 12.289ms fills in 3s and
	// 0.998ns, which came to w = 3 and q = Burst - 1.) The product takes
	// 128 bits; ceil(ceil(x/a)/b) = ceil(x/(a×b)).
	hi, lo := bits.Mul64(uint64(capacity), uint64(l.Period))
	hi, lo = divCeil(hi, lo, uint64(l.Rate))
	hi, lo = divCeil(hi, lo, uint64(time.Second))
	if hi != 0 || lo > MaxInteger {
		return 0, 0, false
	}
	w = max(int64(lo), 1)
	// q = floor(Rate × w × 1s / Period): with Rate × w = a × Period + r,
	// q = a × 1s + floor(r × 1s / Period), every step in 128 bits.
	hi, lo = bits.Mul64(uint64(l.Rate), uint64(w))
	if hi >= uint64(l.Period) { // a >= 2^64
		return 0, 0, false
	}
	a, r := bits.Div64(hi, lo, uint64(l.Period))
	if a > MaxInteger/uint64(time.Second) {
		return 0, 0, false
	}
	fhi, flo := bits.Mul64(r, uint64(time.Second))
	f, _ := bits.Div64(fhi, flo, uint64(l.Period)) // < 1s, as r < Period
	uq := a*uint64(time.Second) + f
	if uq > MaxInteger {
		return 0, 0, false
	}
	return int64(uq), w, true
}

// divCeil returns (hi×2^64 + lo) / c rounded up, for c > 0, as the high
// and low halves of the quotient.
func divCeil(hi, lo, c uint64) (qhi, qlo uint64) {
	qhi, r := hi/c, hi%c
	qlo, r = bits.Div64(r, lo, c)
	if r != 0 {
		qlo++
		if qlo == 0 {
			qhi++
		}
	}
	return qhi, qlo
}

// Policy is one quota policy: a name, and the limit and strategy it stands
// for.
type Policy struct {
	Name     string
	Strategy redlimit.Strategy
	Limit    redlimit.Limit
	rule     string // a redlimit.Policy's: the rule's own name (Name is printable and unique)
}

// Source finds the quota policies of a limiter, and the name of the one
// that decided a result.
//
// A single-strategy limiter has one strategy and one limit: the list has
// one policy, named after the strategy ("token-bucket"), or as the
// middleware was told, with the Limit of each Result (so that a limiter
// that changes it, with WithLimitFunc, or one whose strategy is not known,
// is described as it answered). A redlimit.Policy has one policy per rule,
// named after the rule; with WithRulesFunc, the rules of each call.
type Source struct {
	name     string
	strategy redlimit.Strategy // 0 if the limiter does not report one
	rules    []Policy          // a redlimit.Policy's own rules, in order; nil otherwise
}

// NewSource describes l. name is the name of a single-strategy limiter's
// policy if named; otherwise its strategy's name, or defaultName for a
// limiter that does not report one. A redlimit.Policy ignores both: its
// policies are named after its rules.
func NewSource(l redlimit.Limiter, name string, named bool, defaultName string) Source {
	var s redlimit.Strategy
	if sl, ok := l.(interface{ Strategy() redlimit.Strategy }); ok {
		if s = sl.Strategy(); !slices.Contains(redlimit.Strategies(), s) {
			s = 0 // not one of redlimit's
		}
	}
	// A redlimit.Policy: one quota policy per rule, named as the rule.
	if rl, ok := l.(interface{ Rules() []redlimit.Rule }); ok {
		if rules := ruleQuotas(rl.Rules()); len(rules) > 0 {
			return Source{name: rules[0].Name, rules: rules}
		}
	}
	if !named {
		name = defaultName
		if s != 0 {
			name = s.String()
		}
	}
	return Source{name: name, strategy: s}
}

// ruleQuotas returns one quota policy per rule, named as the rule. Names
// that are the same once made printable (Printable: "请求/秒" and "请求/时"
// both become "______/___") get "-2", "-3"... after the first, so that
// every policy in the list has a name of its own.
func ruleQuotas(rules []redlimit.Rule) []Policy {
	if len(rules) == 0 {
		return nil
	}
	out := make([]Policy, len(rules))
	taken := make(map[string]bool, len(rules))
	for i, r := range rules {
		base := Printable(r.Name)
		name := base
		for k := 2; taken[name]; k++ {
			name = base + "-" + strconv.Itoa(k)
		}
		taken[name] = true
		out[i] = Policy{Name: name, Strategy: r.Strategy, Limit: r.Limit, rule: r.Name}
	}
	return out
}

// Allow calls l.Allow for key. For a redlimit.Policy it also returns the
// rules that decided the call, which a policy with a rules function
// (redlimit.WithRulesFunc) puts in a sink that the call's context carries;
// nil for a policy without one, whose own rules decide every call. ctx is
// not changed: the sink is in a context of the limiter's call only.
func (p Source) Allow(ctx context.Context, l redlimit.Limiter, key string) (redlimit.Result, []redlimit.Rule, error) {
	if p.rules == nil {
		res, err := l.Allow(ctx, key)
		return res, nil, err
	}
	callCtx, sink := callrules.New[redlimit.Rule](ctx)
	res, err := l.Allow(callCtx, key)
	return res, sink.Rules(), err
}

// Reserver is a limiter that can reserve events to settle later, as a
// redlimit.RateLimiter and a redlimit.Policy do.
type Reserver interface {
	Reserve(ctx context.Context, key string, n int) (*redlimit.Reservation, error)
}

// Reserve calls r.Reserve for n events of key, and returns the rules that
// decided it as Allow does.
func (p Source) Reserve(ctx context.Context, r Reserver, key string, n int) (*redlimit.Reservation, []redlimit.Rule, error) {
	if p.rules == nil {
		res, err := r.Reserve(ctx, key, n)
		return res, nil, err
	}
	callCtx, sink := callrules.New[redlimit.Rule](ctx)
	res, err := r.Reserve(callCtx, key, n)
	return res, sink.Rules(), err
}

// Policies returns the quota policies for res, and the name of the one
// that decided it. rules are the rules that decided the call, for a
// redlimit.Policy whose rules are given per call (as Allow returns them);
// nil: the policy's own.
func (p Source) Policies(res redlimit.Result, rules []redlimit.Rule) ([]Policy, string) {
	if p.rules == nil {
		return []Policy{{Name: p.name, Strategy: p.strategy, Limit: res.Limit}}, p.name
	}
	list := ruleQuotas(rules)
	if list == nil {
		list = slices.Clone(p.rules)
	}
	// The deciding rule is reported with the limit that decided, which
	// the fields of the deciding policy describe too. (Found by the rule's
	// own name: two printable names can come from one.)
	for i := range list {
		if list[i].rule == res.Rule {
			list[i].Limit = res.Limit
			return list, list[i].Name
		}
	}
	return list, list[0].Name
}

// Format returns the value of the RateLimit-Policy field for list, a
// Structured Field List of one item per policy: the name as a String, with
// the parameters q and w (see Quota). Policies without a usable limit are
// left out; "" means none is left.
func Format(list []Policy) string {
	var b strings.Builder
	for _, p := range list {
		q, w, ok := Quota(p.Strategy, p.Limit)
		if !ok {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(String(p.Name))
		b.WriteString(";q=")
		b.WriteString(strconv.FormatInt(q, 10))
		b.WriteString(";w=")
		b.WriteString(strconv.FormatInt(w, 10))
	}
	return b.String()
}

// DecidingQuota returns the quota q (see Quota) of the first policy named
// deciding in list, and false if there is none or its limit is not usable.
func DecidingQuota(list []Policy, deciding string) (int64, bool) {
	for _, p := range list {
		if p.Name == deciding {
			q, _, ok := Quota(p.Strategy, p.Limit)
			return q, ok
		}
	}
	return 0, false
}

// Printable replaces the bytes of a rule name that a Structured Field
// String cannot hold (anything but printable ASCII) with '_'.
func Printable(name string) string {
	if IsPrintable(name) {
		return name
	}
	b := []byte(name)
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '_'
		}
	}
	return string(b)
}

// IsPrintable reports whether name can be a policy name: printable ASCII,
// which String encodes.
func IsPrintable(name string) bool {
	for i := 0; i < len(name); i++ {
		if b := name[i]; b < 0x20 || b > 0x7e {
			return false
		}
	}
	return true
}

// String encodes s, printable ASCII, as a Structured Field String
// (RFC 9651, section 3.3.3).
func String(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// ResetAfter is how long until the policy that decided res is back at its
// full allowance, the reset the fields give: a redlimit.Policy's deciding
// rule's own (Result.RuleResetAfter: a per-second rule's second, not an
// hourly rule's hour beside it); else, a Result that names no rule (a
// single limit, or a Limiter of another package), Result.ResetAfter.
func ResetAfter(res redlimit.Result) time.Duration {
	if res.Rule != "" {
		return res.RuleResetAfter
	}
	return res.ResetAfter
}
