package redlimit

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/redlimit/redlimit/internal/callrules"
)

// maxCachedLimits bounds the validated limits a limiter keeps for
// WithLimitFunc; past it, limits are validated on every call.
const maxCachedLimits = 1024

// limitCache holds the rule sets made for the limits WithLimitFunc gave.
type limitCache struct {
	m    sync.Map // Limit -> *ruleSet
	size atomic.Int32
}

// dynamicRules returns the rules for key from the limit or rules function.
func (e *engine) dynamicRules(ctx context.Context, key string) (*ruleSet, error) {
	if f := e.cfg.rulesFunc; f != nil {
		rules, err := f(ctx, key)
		if err != nil {
			return nil, errorf("rules for %q: %w", key, err)
		}
		rs := e.own
		if len(rules) > 0 {
			if rs, err = policyRules(rules); err != nil {
				return nil, errorf("rules for %q: %w", key, err)
			}
		}
		// A caller that asked for the call's rules gets them (httplimit, for
		// its headers; see internal/callrules).
		if s := callrules.From[Rule](ctx); s != nil {
			s.Put(rs.public())
		}
		return rs, nil
	}
	limit, err := e.cfg.limitFunc(ctx, key)
	if err != nil {
		return nil, errorf("limit for %q: %w", key, err)
	}
	if limit == (Limit{}) {
		return e.own, nil
	}
	if v, ok := e.limits.m.Load(limit); ok {
		return v.(*ruleSet), nil
	}
	own := &e.own.rules[0]
	r, err := newRule(own.name, own.alg, limit)
	if err != nil {
		return nil, errorf("limit for %q: %w", key, err)
	}
	rs := newRuleSet([]rule{r})
	if e.limits.size.Load() < maxCachedLimits {
		if _, loaded := e.limits.m.LoadOrStore(limit, rs); !loaded {
			e.limits.size.Add(1)
		}
	}
	return rs, nil
}

// public returns the rules of rs as a Policy's Rules reports them: with
// default names and Burst filled in.
func (rs *ruleSet) public() []Rule {
	out := make([]Rule, len(rs.rules))
	for i, r := range rs.rules {
		out[i] = Rule{Name: r.name, Strategy: r.alg.strategy, Limit: r.limit, PerCall: r.perCall}
	}
	return out
}
