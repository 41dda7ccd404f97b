package redlimit

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Policy is a [Limiter] that holds several rules on one key, all or
// nothing: n events are allowed only if every rule allows them, and a
// denial consumes nothing in any rule. Every rule is decided in one atomic
// script call, so a policy costs one round trip, as a single limiter does.
//
// For example "10 per second AND 1000 per hour":
//
//	p, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
//		{Name: "burst", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(10)},
//		{Name: "hourly", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerHour(1000)},
//	})
//
// The Result of a call: Allowed only if every rule allows; Remaining the
// least over the rules; when denied, RetryAfter the longest among the
// denying rules (after it, with no other traffic, the same n is allowed by
// all); ResetAfter the longest; Delay that of a leaky-bucket rule; Rule and
// Limit the deciding rule's (when denied, the denying rule with the longest
// RetryAfter; when allowed, the rule with the fewest Remaining).
//
// State: each rule keeps the state a single-strategy limiter of its
// Strategy and Period keeps, under the same Redis key, in the key's one
// cluster slot. So a rule and a [RateLimiter] (or a rule of another policy)
// with the same Strategy, Period and prefix share state. Every option of
// the single-strategy limiters works on a policy; its in-process fallback
// is all or nothing too.
//
// It is safe for concurrent use. Call Close when done with it.
type Policy struct {
	engine
}

// NewPolicy returns a limiter that decides every rule for a key in one
// script call: n events are allowed only if every rule allows them, and a
// denial consumes nothing in any rule. It returns an error wrapping
// ErrInvalidLimit for no rules, more than [MaxRules], an invalid limit, two
// rules with the same Strategy and Period (they would share one state), or
// two with the same name, and one wrapping ErrInvalidArgument for an invalid option.
func NewPolicy(rdb redis.UniversalClient, rules []Rule, opts ...Option) (*Policy, error) {
	rs, err := policyRules(rules)
	if err != nil {
		return nil, err
	}
	p := new(Policy)
	if err := p.init(rdb, "policy", rs.rules, policyScript(), opts); err != nil {
		return nil, err
	}
	if p.cfg.limitFunc != nil {
		_ = p.Close() // it joined the client's watches; unused, it has nothing to report
		return nil, errorf("policy: WithLimitFunc is for single-strategy limiters; use WithRulesFunc: %w", ErrInvalidArgument)
	}
	bake(p.own, &p.cfg)
	return p, nil
}

// policyRules checks a policy's rules and prepares them.
func policyRules(rules []Rule) (*ruleSet, error) {
	bad := func(format string, args ...any) (*ruleSet, error) {
		return nil, errorf("policy: %s: %w", fmt.Sprintf(format, args...), ErrInvalidLimit)
	}
	switch {
	case len(rules) == 0:
		return bad("no rules")
	case len(rules) > MaxRules:
		return bad("%d rules, more than %d", len(rules), MaxRules)
	}
	out := make([]rule, len(rules))
	for i, r := range rules {
		alg, ok := algorithmOf(r.Strategy)
		if !ok {
			return bad("rule %d: unknown strategy %v", i, r.Strategy)
		}
		name := r.Name
		if name == "" {
			name = defaultRuleName(r.Strategy, r.Limit.Period)
			if r.Limit.isCalendar() {
				name = r.Strategy.String() + "-" + r.Limit.cal.Name()
			}
		}
		ru, err := newRule(name, alg, r.Limit)
		if err != nil {
			return nil, errorf("policy: rule %q: %w", name, err)
		}
		if r.PerCall {
			ru.perCall = true
			ru.args[0] = "*" + ru.args[0].(string) // the code: a calendar rule's is not its strategy's
		}
		for j := range out[:i] {
			if out[j].name == name {
				return bad("two rules named %q", name)
			}
			if out[j].suffix == ru.suffix {
				return bad("rules %q and %q have the same strategy and period (they would share one state)", out[j].name, name)
			}
		}
		out[i] = ru
	}
	return newRuleSet(out), nil
}

// defaultRuleName names a rule by its strategy and period: "fixed-window-1h",
// "token-bucket-1s", "sliding-log-250ms" (a calendar rule by its calendar:
// "fixed-window-daily-Asia/Tokyo", see calendar.name).
func defaultRuleName(s Strategy, p time.Duration) string {
	units := []struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "us"}}
	for _, u := range units {
		if p >= u.d && p%u.d == 0 {
			return s.String() + "-" + strconv.FormatInt(int64(p/u.d), 10) + u.name
		}
	}
	return s.String() + "-" + strconv.FormatInt(int64(p), 10) + "ns"
}

// Rules returns the policy's rules, with default names and Burst filled in.
func (p *Policy) Rules() []Rule { return p.own.public() }
