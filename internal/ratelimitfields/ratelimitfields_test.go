package ratelimitfields_test

import (
	"math"
	"math/big"
	"math/rand/v2"
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

// TestQuotaCoversBurst checks limits whose span, Burst × Period / Rate,
// is a fraction of a nanosecond past whole seconds: rounded down to whole
// nanoseconds, it made w a second short and q = Burst - 1, less than the
// Burst that r shows for a full bucket.
func TestQuotaCoversBurst(t *testing.T) {
	t.Parallel()
	tests := []struct {
		s     redlimit.Strategy
		limit redlimit.Limit
		q, w  int64
	}{
		// 3s and 0.998ns: w = 4, q = floor(1002 × 4s / 12.289ms).
		{redlimit.TokenBucket, redlimit.Limit{Rate: 1002, Period: 12289 * time.Microsecond, Burst: 244609}, 326145, 4},
		{redlimit.LeakyBucket, redlimit.Limit{Rate: 1002, Period: 12289 * time.Microsecond, Burst: 244609}, 326145, 4},
		{redlimit.TokenBucket, redlimit.Limit{Rate: 1003, Period: 5419 * time.Microsecond, Burst: 370179}, 555268, 3},
		// Whole seconds stay exact.
		{redlimit.TokenBucket, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, 20, 2},
		{redlimit.FixedWindow, redlimit.Limit{Rate: 10, Period: 100 * time.Millisecond}, 100, 1},
		{redlimit.SlidingLog, redlimit.Limit{Rate: 3, Period: 1500 * time.Millisecond}, 4, 2},
		// No usable limit, and a q past MaxInteger.
		{redlimit.TokenBucket, redlimit.Limit{Period: time.Second}, 0, 0},
		{redlimit.TokenBucket, redlimit.Limit{Rate: redlimit.MaxRate, Period: time.Millisecond}, 0, 0},
	}
	for _, tt := range tests {
		q, w, ok := ratelimitfields.Quota(tt.s, tt.limit)
		assert.Equal(t, []any{tt.q, tt.w, tt.w > 0}, []any{q, w, ok}, "Quota(%v, %v)", tt.s, tt.limit)
	}
}

// TestQuotaProperties checks Quota (see checkQuota) for random limits of
// every size redlimit accepts and of every strategy (0 too), and for
// random buckets whose span is less than a nanosecond past whole seconds,
// as in TestQuotaCoversBurst.
func TestQuotaProperties(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	// logUniform returns an integer in [lo, hi], as likely in each power
	// of two, and sometimes an end.
	logUniform := func(lo, hi int64) int64 {
		switch r.IntN(16) {
		case 0:
			return lo
		case 1:
			return hi
		}
		v := int64(math.Exp(r.Float64() * math.Log(float64(hi))))
		return min(max(v, lo), hi)
	}
	strategies := append(redlimit.Strategies(), 0)
	oks := 0
	for i := range 50_000 {
		l := redlimit.Limit{
			Rate:   int(logUniform(1, redlimit.MaxRate)),
			Period: time.Duration(logUniform(int64(time.Millisecond), int64(redlimit.MaxPeriod))),
		}
		if r.IntN(4) > 0 {
			l.Burst = int(logUniform(1, redlimit.MaxRate))
		}
		if checkQuota(t, strategies[i%len(strategies)], l) {
			oks++
		}
	}
	// Both answers are common: the limits span the range.
	assert.Greater(t, oks, 10_000, "%d of 50000 limits have a quota", oks)
	assert.Less(t, oks, 49_500, "%d of 50000 limits have a quota", oks)

	// Buckets whose span is w seconds and less than a nanosecond: Burst is
	// the least that passes w seconds, kept when Burst × Period passes
	// w × Rate × 1s by less than Rate.
	edges := 0
	for edges < 200 {
		l := redlimit.Limit{
			Rate:   int(logUniform(1, 1e7)),
			Period: time.Duration(logUniform(int64(time.Millisecond), int64(time.Second))),
		}
		w := big.NewInt(logUniform(1, 1000))
		full := new(big.Int).Mul(new(big.Int).Mul(w, big.NewInt(int64(l.Rate))), big.NewInt(int64(time.Second)))
		burst := new(big.Int).Div(full, big.NewInt(int64(l.Period)))
		burst.Add(burst, big.NewInt(1))
		past := new(big.Int).Sub(new(big.Int).Mul(burst, big.NewInt(int64(l.Period))), full)
		if past.Cmp(big.NewInt(int64(l.Rate))) >= 0 || burst.Cmp(big.NewInt(redlimit.MaxRate)) > 0 {
			continue
		}
		l.Burst = int(burst.Int64())
		edges++
		for _, s := range []redlimit.Strategy{redlimit.TokenBucket, redlimit.LeakyBucket, 0} {
			checkQuota(t, s, l)
		}
	}
}

// checkQuota checks what httplimit.Quota promises for a limit l of
// strategy s, with exact arithmetic in math/big: w is the span capacity ×
// Period / Rate rounded up to whole seconds (at least 1), q = floor(Rate ×
// w / Period), so q is at least the capacity (Rate for the windows, Burst
// for the buckets, max(Rate, Burst) for any other strategy) and q/w is the
// rate less under one event per window; ok is false only when q or w does
// not fit a Structured Field Integer. It returns ok.
func checkQuota(t *testing.T, s redlimit.Strategy, l redlimit.Limit) bool {
	t.Helper()
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
	second := big.NewInt(int64(time.Second))
	rate, period, c := big.NewInt(int64(l.Rate)), big.NewInt(int64(l.Period)), big.NewInt(int64(capacity))

	// w = max(1, ceil(capacity × Period / (Rate × 1s))), and q from it.
	span := new(big.Int).Mul(c, period)
	den := new(big.Int).Mul(rate, second)
	wantW := new(big.Int).Div(new(big.Int).Add(span, new(big.Int).Sub(den, big.NewInt(1))), den)
	if wantW.Sign() == 0 {
		wantW.SetInt64(1)
	}
	rw := new(big.Int).Mul(new(big.Int).Mul(rate, wantW), second) // Rate × w × 1s
	wantQ := new(big.Int).Div(rw, period)
	fits := wantQ.Cmp(big.NewInt(ratelimitfields.MaxInteger)) <= 0 && wantW.Cmp(big.NewInt(ratelimitfields.MaxInteger)) <= 0

	q, w, ok := ratelimitfields.Quota(s, l)
	if !assert.Equal(t, fits, ok, "Quota(%v, %v) = %d, %d, %v", s, l, q, w, ok) || !ok {
		return ok
	}
	bq, bw := big.NewInt(q), big.NewInt(w)
	if !assert.Equal(t, wantW.String(), bw.String(), "Quota(%v, %v): w", s, l) ||
		!assert.Equal(t, wantQ.String(), bq.String(), "Quota(%v, %v): q", s, l) {
		return ok
	}
	assert.GreaterOrEqual(t, q, int64(capacity), "Quota(%v, %v) = %d, %d: q < capacity %d", s, l, q, w, capacity)
	assert.GreaterOrEqual(t, w, int64(1), "Quota(%v, %v) = %d, %d: w < 1", s, l, q, w)
	// q/w <= Rate/Period < (q+1)/w.
	qp := new(big.Int).Mul(bq, period)
	assert.True(t, qp.Cmp(rw) <= 0, "Quota(%v, %v) = %d, %d: q/w above the rate", s, l, q, w)
	assert.True(t, qp.Add(qp, period).Cmp(rw) > 0, "Quota(%v, %v) = %d, %d: q/w a whole event below the rate", s, l, q, w)
	// w is the least whole number of seconds the span fits in.
	if w > 1 {
		prev := new(big.Int).Mul(new(big.Int).Mul(rate, big.NewInt(w-1)), second)
		assert.True(t, prev.Cmp(span) < 0, "Quota(%v, %v) = %d, %d: w-1 seconds are enough", s, l, q, w)
	}
	return ok
}
