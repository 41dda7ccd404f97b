package ratelimitfields_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// stub is a Limiter that reports a strategy; ruled also reports rules.
type stub struct {
	redlimit.Limiter
	strategy redlimit.Strategy
}

func (s stub) Strategy() redlimit.Strategy { return s.strategy }

type ruled struct {
	stub
	rules []redlimit.Rule
}

func (r ruled) Rules() []redlimit.Rule { return r.rules }

func TestSourceNames(t *testing.T) {
	t.Parallel()
	res := redlimit.Result{Limit: redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}}
	for _, tt := range []struct {
		name    string
		src     ratelimitfields.Source
		want    string
		decider string
	}{
		{"strategy", ratelimitfields.NewSource(stub{strategy: redlimit.TokenBucket}, "", false, "default"), `"token-bucket";q=20;w=2`, "token-bucket"},
		{"named", ratelimitfields.NewSource(stub{strategy: redlimit.TokenBucket}, `a"b`, true, "default"), `"a\"b";q=20;w=2`, `a"b`},
		{"unknown strategy", ratelimitfields.NewSource(stub{strategy: 99}, "", false, "default"), `"default";q=20;w=2`, "default"},
		{"policy", ratelimitfields.NewSource(ruled{rules: []redlimit.Rule{
			{Name: "s\x01", Strategy: redlimit.FixedWindow, Limit: redlimit.PerSecond(5)},
			{Name: "h", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(100)},
		}}, "ignored", true, "default"), `"s_";q=5;w=1, "h";q=100;w=3600`, "s_"},
	} {
		list, deciding := tt.src.Policies(res, nil)
		assert.Equal(t, tt.want, ratelimitfields.Format(list), tt.name)
		assert.Equal(t, tt.decider, deciding, tt.name)
	}
}

// Rule names that are the same once made printable name policies of their
// own, and the deciding rule is found by its own name.
func TestPoliciesPrintableNamesCollide(t *testing.T) {
	t.Parallel()
	rules := []redlimit.Rule{
		{Name: "请求/秒", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(10)},
		{Name: "请求/时", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(3)},
		{Name: "______/___-2", Strategy: redlimit.SlidingLog, Limit: redlimit.PerMinute(5)},
	}
	src := ratelimitfields.NewSource(ruled{rules: rules}, "", false, "default")
	const want = `"______/___";q=10;w=1, "______/___-2";q=3;w=3600, "______/___-2-2";q=5;w=60`
	for i, deciding := range []string{"______/___", "______/___-2", "______/___-2-2"} {
		r := rules[i]
		for _, call := range [][]redlimit.Rule{nil, rules} { // the policy's own rules, and a call's
			list, got := src.Policies(redlimit.Result{Rule: r.Name, Limit: r.Limit}, call)
			assert.Equal(t, want, ratelimitfields.Format(list), "decided by %q", r.Name)
			assert.Equal(t, deciding, got, "decided by %q", r.Name)
			q, _, _ := ratelimitfields.Quota(r.Strategy, r.Limit)
			gotQ, ok := ratelimitfields.DecidingQuota(list, got)
			assert.Equal(t, []any{q, true}, []any{gotQ, ok}, "decided by %q", r.Name)
		}
	}
}

// A Policy's deciding rule is reported with the Result's limit, and the
// rules of the call replace the policy's own.
func TestPoliciesDeciding(t *testing.T) {
	t.Parallel()
	src := ratelimitfields.NewSource(ruled{rules: []redlimit.Rule{
		{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(2)},
		{Name: "hour", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(20)},
	}}, "", false, "default")
	res := redlimit.Result{Rule: "hour", Limit: redlimit.PerHour(30)}
	list, deciding := src.Policies(res, nil)
	assert.Equal(t, `"second";q=2;w=1, "hour";q=30;w=3600`, ratelimitfields.Format(list))
	q, ok := ratelimitfields.DecidingQuota(list, deciding)
	assert.Equal(t, []any{int64(30), true}, []any{q, ok})

	list, deciding = src.Policies(res, []redlimit.Rule{
		{Name: "minute", Strategy: redlimit.SlidingLog, Limit: redlimit.PerMinute(600)},
	})
	assert.Equal(t, `"minute";q=600;w=60`, ratelimitfields.Format(list), "the call's rules")
	assert.Equal(t, "minute", deciding, "no rule of the Result's name: the first")
	list, _ = src.Policies(redlimit.Result{Rule: "second"}, nil)
	assert.Equal(t, `"hour";q=20;w=3600`, ratelimitfields.Format(list), "a rule without a usable limit is left out")
	_, ok = ratelimitfields.DecidingQuota(list, "second")
	assert.False(t, ok, "the deciding rule has no usable limit")
	_, ok = ratelimitfields.DecidingQuota(list, "none")
	assert.False(t, ok, "no such policy")
}
