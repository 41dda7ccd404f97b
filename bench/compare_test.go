package bench

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func miniEnv(t *testing.T) *Env {
	t.Helper()
	m := miniredis.RunT(t)
	env, err := NewEnv(m.Addr(), patientOptions(m.Addr()), true)
	require.NoError(t, err)
	t.Cleanup(env.Close)
	return env
}

func redisEnv(t *testing.T) *Env {
	t.Helper()
	s := redistest.Start(t)
	env, err := NewEnv(s.Addr, patientOptions(s.Addr), false)
	require.NoError(t, err)
	t.Cleanup(env.Close)
	return env
}

// patientOptions are the tuned client options with 2 s timeouts, as
// cmd/compare uses by default: with other jobs on a 2-core machine a call
// can wait past 100 ms, and then fails the test for nothing.
func patientOptions(addr string) *redis.Options {
	o := redistest.TunedOptions(addr)
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = 2*time.Second, 2*time.Second, 2*time.Second, 2*time.Second
	return o
}

// TestCompareMiniredis runs the whole comparison for a few milliseconds per
// contender on miniredis: every contender must decide without errors, the
// workloads that never reach the limit must allow everything, and the hot
// key must be mostly denied.
func TestCompareMiniredis(t *testing.T) {
	env := miniEnv(t)
	var sb strings.Builder
	rep, err := Run(context.Background(), Config{
		Env:         env,
		Concurrency: []int{2},
		Rounds:      1,
		Duration:    20 * time.Millisecond,
		NumKeys:     100,
		HotRate:     2,
		Seed:        1,
	})
	require.NoError(t, err)
	rep.Markdown(&sb)
	assert.Empty(t, rep.Skipped, "contenders skipped: %v", rep.Skipped)
	got, want := len(rep.Rows), 3*len(Contenders())
	require.Equal(t, want, got, "got %d rows, want %d", got, want)
	for _, row := range rep.Rows {
		ops, allowed, errs, first := row.TotalOps()
		if !assert.NotZero(t, ops, "%s %s: %d decisions, %d errors (%s), want > 0 and none", row.Workload, row.Contender, ops, errs, first) ||
			!assert.Zero(t, errs, "%s %s: %d decisions, %d errors (%s), want > 0 and none", row.Workload, row.Contender, ops, errs, first) {
			continue
		}
		assert.Greater(t, row.Ratio(), 0.0, "%s %s: no ratio to INCR", row.Workload, row.Contender)
		switch {
		case row.Workload != "hot":
			assert.Equal(t, ops, allowed, "%s %s: allowed %d of %d, want all", row.Workload, row.Contender, allowed, ops)
		case row.Kind != "floor":
			// A 2/s limit offered thousands per second: a window or a
			// bucket lets through about 2 (go-zero's bucket, in whole
			// seconds, a few more).
			assert.LessOrEqual(t, allowed*2, ops, "hot %s: allowed %d of %d, want most denied", row.Contender, allowed, ops)
		}
		assert.Contains(t, sb.String(), row.Contender, "%s missing from the table", row.Contender)
	}
	assert.Contains(t, sb.String(), "not Redis", "the table does not say that miniredis figures are not Redis's")
}

// TestRedisModes runs the memory, ceiling and AutoPipeliner modes briefly on
// a real redis-server (skipped without one, see internal/redistest).
func TestRedisModes(t *testing.T) {
	env := redisEnv(t)
	ctx := context.Background()

	mem, err := Memory(ctx, env, 200)
	require.NoError(t, err)
	for _, row := range mem.Rows {
		assert.Greater(t, row.Bytes, int64(0), "memory %s: %d bytes in %v", row.Contender, row.Bytes, row.Keys)
		assert.NotEmpty(t, row.Keys, "memory %s: %d bytes in %v", row.Contender, row.Bytes, row.Keys)
	}

	ceil, err := Ceiling(ctx, env, CeilingConfig{Duration: 30 * time.Millisecond})
	require.NoError(t, err)
	// Where the server has Redis Functions, the ceiling measures the
	// library's too, and the FCALL floor.
	functions := env.Admin.FunctionList(ctx, redis.FunctionListQuery{}).Err() == nil
	fcalls, want := 0, 0
	if functions {
		want = 3 * (len(redlimit.Strategies()) + 2) // every strategy, the policy and FCALL return 1, in 3 workloads
	}
	for _, row := range ceil.Rows {
		if row.Name == "FCALL return 1" || strings.HasSuffix(row.Name, functionsSuffix) {
			fcalls++
		}
	}
	assert.Equal(t, want, fcalls, "ceiling rows of Redis Functions")
	for _, row := range ceil.Rows {
		assert.Greater(t, row.GoOps, 0.0, "ceiling %s %s: %.0f/s, %d errors (%s), %.2f µs/call", row.Workload, row.Name, row.GoOps, row.GoErrs, row.FirstErr, row.UsecPerCall)
		assert.Zero(t, row.GoErrs, "ceiling %s %s: %.0f/s, %d errors (%s), %.2f µs/call", row.Workload, row.Name, row.GoOps, row.GoErrs, row.FirstErr, row.UsecPerCall)
		assert.Greater(t, row.UsecPerCall, 0.0, "ceiling %s %s: %.0f/s, %d errors (%s), %.2f µs/call", row.Workload, row.Name, row.GoOps, row.GoErrs, row.FirstErr, row.UsecPerCall)
	}

	// A variant of the scripts (here the scripts in use, from ../scripts)
	// decides like the scripts in use, unpipelined and in the ceiling.
	var vs []Contender
	for _, c := range []Contender{Redlimit(redlimit.SlidingLog, Direct), Policy()} {
		vs = append(vs, c, Variant(c, "../scripts"))
	}
	vrep, err := Run(ctx, Config{Env: env, Contenders: vs, Workloads: []string{"keys"},
		Concurrency: []int{4}, Rounds: 1, Duration: 30 * time.Millisecond, NumKeys: 50})
	require.NoError(t, err)
	if len(vrep.Rows) != len(vs) {
		t.Errorf("variants: %d rows for %d contenders (skipped: %v)", len(vrep.Rows), len(vs), vrep.Skipped)
	}
	for _, row := range vrep.Rows {
		if ops, allowed, errs, first := row.TotalOps(); ops == 0 || errs > 0 || allowed != ops {
			t.Errorf("%s: %d decisions, %d allowed, %d errors (%s)", row.Contender, ops, allowed, errs, first)
		}
	}
	vceil, err := Ceiling(ctx, env, CeilingConfig{Duration: 20 * time.Millisecond, Only: regexp.MustCompile("sliding-log"), Variants: []string{"../scripts"}})
	require.NoError(t, err)
	want = 3 * 3 // INCR, the log and its variant, in 3 workloads
	if functions {
		want += 3 // the log as a function
	}
	if got := len(vceil.Rows); got != want {
		t.Errorf("ceiling with a variant: %d rows, want %d", got, want)
	}
	// The variant runs at its workload's limit: on the hot key (100/s,
	// offered far more) it is denied as its contender is, not allowed at
	// the limit of another workload.
	for _, row := range vceil.Rows {
		if row.Workload == "hot" && strings.HasPrefix(row.Name, "redlimit") {
			assert.Less(t, row.GoAllowed, 0.5, "ceiling hot %s: %.0f%% allowed of %.0f/s, want the 100/s limit to deny most", row.Name, 100*row.GoAllowed, row.GoOps)
		}
	}

	require.NoError(t, env.EnableAutoPipeline())
	ns, err := CheckNoScript(ctx, env)
	require.NoError(t, err)
	for _, line := range ns.Single {
		assert.Contains(t, line, "after SCRIPT FLUSH allowed=true err=<nil>", "NOSCRIPT through the AutoPipeliner: %s", line)
	}
	assert.NotZero(t, ns.LoadOps, "NOSCRIPT under load: %d decisions, %d errors (%s)", ns.LoadOps, ns.LoadErrs, ns.LoadFirstErr)
	assert.Zero(t, ns.LoadErrs, "NOSCRIPT under load: %d decisions, %d errors (%s)", ns.LoadOps, ns.LoadErrs, ns.LoadFirstErr)
	rep, err := Run(ctx, Config{
		Env: env, Contenders: AutoPipelineContenders(), Workloads: []string{"keys"},
		Concurrency: []int{16}, Rounds: 1, Duration: 30 * time.Millisecond, NumKeys: 100,
	})
	require.NoError(t, err)
	for _, row := range rep.Rows {
		ops, allowed, errs, first := row.TotalOps()
		assert.NotZero(t, ops, "%s: %d decisions, %d allowed, %d errors (%s)", row.Contender, ops, allowed, errs, first)
		assert.Zero(t, errs, "%s: %d decisions, %d allowed, %d errors (%s)", row.Contender, ops, allowed, errs, first)
		assert.Equal(t, ops, allowed, "%s: %d decisions, %d allowed, %d errors (%s)", row.Contender, ops, allowed, errs, first)
	}
}

func TestHistQuantile(t *testing.T) {
	h := new(hist)
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, 1000 * time.Microsecond}} {
		got := h.quantile(c.q)
		diff := float64(got-c.want) / float64(c.want)
		assert.InDelta(t, 0, diff, 1.0/64, "quantile(%v) = %v, want %v within 1/64", c.q, got, c.want)
	}
	for _, v := range []uint64{0, 1, 127, 128, 129, 1000, 123456789, 1 << 46} {
		i := histIndex(v)
		mid := histValue(i)
		assert.GreaterOrEqual(t, float64(mid), float64(v)*(1-1.0/64), "value %d: bucket %d middle %d, more than 1/64 off", v, i, mid)
		assert.LessOrEqual(t, float64(mid), float64(v)*(1+1.0/64)+1, "value %d: bucket %d middle %d, more than 1/64 off", v, i, mid)
	}
}
