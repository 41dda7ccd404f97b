package httplimit

import (
	"context"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/callrules"
)

// Quota returns the quota policy that the RateLimit-Policy field
// advertises for a limit l of strategy s: q events (quota units) in a
// window of w seconds.
//
// The policy is the most that r, the RateLimit field's remaining quota, can
// show, at the limit's steady rate:
//
//   - FixedWindow, SlidingLog, SlidingCounter: Rate events per Period.
//   - TokenBucket, LeakyBucket: Burst events per Burst × Period / Rate, the
//     time an empty bucket takes to fill. A client can spend the whole
//     burst, wait w, and spend it again; and q is at least Burst, which r
//     shows when the bucket is full. Quoting Rate instead (q=10 for Rate
//     10, Burst 20) would let r exceed q.
//   - Any other s (0, for a Limiter that does not report its strategy):
//     as a bucket of max(Rate, Burst), which r cannot exceed either way.
//
// The draft (draft-ietf-httpapi-ratelimit-headers) has w in whole seconds,
// at least 1, so the policy's span is rounded up to w seconds and q is the
// steady rate over w, rounded down: q = floor(Rate × w / Period). That is
// exact when the span is whole seconds (q is Rate, or Burst). Otherwise q/w
// is the true rate less at most one event per window, never more, and q
// is still at least Rate (or Burst): 10 per 100ms gives q=100;w=1 rather
// than q=10;w=1, a tenth of the rate; 3 per 1.5s gives q=4;w=2. Scaling
// only periods under a second to one second would leave periods such as
// 1.5s understated; rounding the span up and scaling q to it covers both.
//
// ok is false when l has no positive Rate and Period, or q does not fit a
// Structured Field Integer (15 digits).
func Quota(s redlimit.Strategy, l redlimit.Limit) (q, w int64, ok bool) {
	if l.Rate <= 0 || l.Period <= 0 {
		return 0, 0, false
	}
	capacity := l.Rate
	switch s {
	case redlimit.FixedWindow, redlimit.SlidingLog, redlimit.SlidingCounter:
	case redlimit.TokenBucket, redlimit.LeakyBucket:
		if l.Burst > 0 {
			capacity = l.Burst
		}
	default:
		capacity = max(l.Rate, l.Burst)
	}
	span, ok := mulDiv(uint64(capacity), uint64(l.Period), uint64(l.Rate))
	if !ok {
		return 0, 0, false
	}
	w = max(int64((span+uint64(time.Second)-1)/uint64(time.Second)), 1)
	uq, ok := mulDiv(uint64(l.Rate), uint64(w)*uint64(time.Second), uint64(l.Period))
	if !ok || uq > sfMaxInteger || w > sfMaxInteger {
		return 0, 0, false
	}
	return int64(uq), w, true
}

// sfMaxInteger is the largest Structured Field Integer (RFC 9651, section
// 3.3.1).
const sfMaxInteger = 999_999_999_999_999

// mulDiv returns a × b / c rounded down (c > 0), and false if it does not
// fit an int64.
func mulDiv(a, b, c uint64) (uint64, bool) {
	hi, lo := bits.Mul64(a, b)
	if hi >= c {
		return 0, false
	}
	q, _ := bits.Div64(hi, lo, c)
	return q, q <= math.MaxInt64
}

// quotaPolicy is one quota policy of the RateLimit-Policy field: a name,
// and the limit and strategy it stands for.
type quotaPolicy struct {
	name     string
	strategy redlimit.Strategy
	limit    redlimit.Limit
}

// policySource finds the quota policies of a limiter, and the name of the
// one that decided a result.
//
// A single-strategy limiter has one strategy and one limit: the list has
// one policy, named after the strategy ("token-bucket"), or as
// WithPolicyName says, with the Limit of each Result (so that a limiter
// that changes it, with WithLimitFunc, or one whose strategy is not known,
// is described as it answered). A redlimit.Policy has one policy per rule,
// named after the rule; with WithRulesFunc, the rules of each call.
type policySource struct {
	name     string
	strategy redlimit.Strategy // 0 if the limiter does not report one
	rules    []quotaPolicy     // a redlimit.Policy's own rules, in order; nil otherwise
}

// newPolicySource describes l. name is WithPolicyName's, if named; a
// redlimit.Policy ignores it.
func newPolicySource(l redlimit.Limiter, name string, named bool) policySource {
	var s redlimit.Strategy
	if sl, ok := l.(interface{ Strategy() redlimit.Strategy }); ok {
		if s = sl.Strategy(); !slices.Contains(redlimit.Strategies(), s) {
			s = 0 // not one of redlimit's
		}
	}
	// A redlimit.Policy: one quota policy per rule, named as the rule.
	if rl, ok := l.(interface{ Rules() []redlimit.Rule }); ok {
		if rules := ruleQuotas(rl.Rules()); len(rules) > 0 {
			return policySource{name: rules[0].name, rules: rules}
		}
	}
	if !named {
		name = DefaultPolicyName
		if s != 0 {
			name = s.String()
		}
	}
	return policySource{name: name, strategy: s}
}

// ruleQuotas returns one quota policy per rule, named as the rule.
func ruleQuotas(rules []redlimit.Rule) []quotaPolicy {
	if len(rules) == 0 {
		return nil
	}
	out := make([]quotaPolicy, len(rules))
	for i, r := range rules {
		out[i] = quotaPolicy{name: printable(r.Name), strategy: r.Strategy, limit: r.Limit}
	}
	return out
}

// allow calls l.Allow for key. For a redlimit.Policy it also returns the
// rules that decided the call, which a policy with a rules function
// (redlimit.WithRulesFunc) puts in a sink that the call's context carries;
// nil for a policy without one, whose own rules decide every call.
func (p policySource) allow(ctx context.Context, l redlimit.Limiter, key string) (redlimit.Result, []redlimit.Rule, error) {
	if p.rules == nil {
		res, err := l.Allow(ctx, key)
		return res, nil, err
	}
	callCtx, sink := callrules.New[redlimit.Rule](ctx)
	res, err := l.Allow(callCtx, key)
	return res, sink.Rules(), err
}

// policies returns the quota policies for res, and the name of the one that
// decided it. rules are the rules that decided the call, for a
// redlimit.Policy whose rules are given per call; nil: the policy's own.
func (p policySource) policies(res redlimit.Result, rules []redlimit.Rule) ([]quotaPolicy, string) {
	if p.rules == nil {
		return []quotaPolicy{{name: p.name, strategy: p.strategy, limit: res.Limit}}, p.name
	}
	list := ruleQuotas(rules)
	if list == nil {
		list = slices.Clone(p.rules)
	}
	// The deciding rule is reported with the limit that decided, which
	// RateLimit and X-RateLimit-Limit describe too.
	name := printable(res.Rule)
	for i := range list {
		if list[i].name == name {
			list[i].limit = res.Limit
			return list, name
		}
	}
	return list, list[0].name
}

// printable replaces the bytes of a rule name that a Structured Field
// String cannot hold (anything but printable ASCII) with '_'.
func printable(name string) string {
	if checkPolicyName(name) {
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

// formatPolicies returns the value of the RateLimit-Policy field for list,
// a Structured Field List of one item per policy: the name as a String,
// with the parameters q and w (see Quota). Policies without a usable limit
// are left out; "" means none is left.
func formatPolicies(list []quotaPolicy) string {
	var b strings.Builder
	for _, p := range list {
		q, w, ok := Quota(p.strategy, p.limit)
		if !ok {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		b.WriteString(sfString(p.name))
		b.WriteString(";q=")
		b.WriteString(strconv.FormatInt(q, 10))
		b.WriteString(";w=")
		b.WriteString(strconv.FormatInt(w, 10))
	}
	return b.String()
}

// formatRateLimit returns the value of the RateLimit field: the policy
// named name, which decided res, with its remaining quota r and the
// seconds t until the key is back at its full allowance.
func formatRateLimit(name string, res redlimit.Result) string {
	return sfString(name) + ";r=" + strconv.FormatInt(remaining(res), 10) +
		";t=" + strconv.FormatInt(resetSeconds(res), 10)
}

// remaining is res.Remaining as a Structured Field Integer: not negative,
// at most 15 digits.
func remaining(res redlimit.Result) int64 {
	return min(int64(max(res.Remaining, 0)), sfMaxInteger)
}

// resetSeconds is res.ResetAfter in whole seconds, rounded up (at most
// 10 digits, so always a Structured Field Integer).
func resetSeconds(res redlimit.Result) int64 {
	return ceilSeconds(res.ResetAfter)
}

// checkPolicyName reports whether name can be a policy name: printable
// ASCII, which sfString encodes.
func checkPolicyName(name string) bool {
	for i := 0; i < len(name); i++ {
		if b := name[i]; b < 0x20 || b > 0x7e {
			return false
		}
	}
	return true
}
