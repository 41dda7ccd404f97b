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
