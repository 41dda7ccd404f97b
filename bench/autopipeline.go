package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit"
)

// EnableAutoPipeline makes Env.AP: go-redis's experimental AutoPipeliner
// over Env.RDB, with its default options for the blocking face
// (DefaultBlockingAutoPipelineOptions: one ordered batch stream).
func (e *Env) EnableAutoPipeline() error {
	ap, err := e.RDB.AutoPipeline()
	if err != nil {
		return fmt.Errorf("bench: AutoPipeline: %w", err)
	}
	e.AP = ap
	return nil
}

// AutoPipelineContenders returns the contenders of the AutoPipeliner
// comparison: the unpipelined INCR floor (the ratio's base), INCR and
// EVALSHA of `return 1` through the AutoPipeliner, every redlimit strategy
// through it, and the token bucket without it for reference.
func AutoPipelineContenders() []Contender {
	cs := []Contender{Incr(Direct), Incr(ViaAutoPipeline), EvalReturn1(ViaAutoPipeline)}
	for _, s := range redlimit.Strategies() {
		cs = append(cs, Redlimit(s, ViaAutoPipeline))
	}
	cs = append(cs, Redlimit(redlimit.TokenBucket, Direct))
	return cs
}

// NoScriptReport tells whether redlimit recovers from a flushed script cache
// through the AutoPipeliner.
type NoScriptReport struct {
	Single []string // per strategy: the outcome of one decision right after SCRIPT FLUSH
	// Under load: 64 goroutines deciding through the AutoPipeliner while the
	// script cache is flushed every 100 ms.
	LoadOps, LoadErrs, Flushes uint64
	LoadFirstErr               string
	// From INFO commandstats over the load test: EVALSHA calls refused
	// (NOSCRIPT), and EVAL calls (Script.Run's fallback).
	EvalShaRefused, Evals string
}

// CheckNoScript flushes the script cache and makes one decision per
// strategy through Env.AP, then does the same under load.
func CheckNoScript(ctx context.Context, env *Env) (*NoScriptReport, error) {
	if env.AP == nil {
		return nil, fmt.Errorf("bench: no AutoPipeliner")
	}
	rep := &NoScriptReport{}
	for _, s := range redlimit.Strategies() {
		line, err := noScriptOnce(ctx, env, s)
		if err != nil {
			return nil, err
		}
		rep.Single = append(rep.Single, line)
	}
	if err := noScriptLoad(ctx, env, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// noScriptOnce makes a decision of strategy s through Env.AP, flushes the
// script cache and makes another, and says what each returned.
func noScriptOnce(ctx context.Context, env *Env, s redlimit.Strategy) (string, error) {
	l, err := redlimit.New(env.AP, s, redlimit.PerSecond(1000), redlimit.WithFallback(redlimit.FallbackError))
	if err != nil {
		return "", err
	}
	defer func() { _ = l.(io.Closer).Close() }() // no prefetch, no reservation: nothing to report
	// Load the script, then lose it.
	_, err0 := l.Allow(ctx, "noscript")
	if err := env.Admin.ScriptFlush(ctx).Err(); err != nil {
		return "", err
	}
	res, err := l.Allow(ctx, "noscript")
	return fmt.Sprintf("%v: before flush err=%v; after SCRIPT FLUSH allowed=%v err=%v", s, err0, res.Allowed, err), nil
}

// noScriptLoad makes decisions from 64 goroutines through Env.AP while
// the script cache is flushed every 100 ms, 10 times, and records in rep
// how they went.
func noScriptLoad(ctx context.Context, env *Env, rep *NoScriptReport) error {
	l, err := redlimit.New(env.AP, redlimit.TokenBucket, redlimit.PerSecond(100_000), redlimit.WithFallback(redlimit.FallbackError))
	if err != nil {
		return err
	}
	defer func() { _ = l.(io.Closer).Close() }() // no prefetch, no reservation: nothing to report
	if err := env.Admin.ConfigResetStat(ctx).Err(); err != nil {
		return err
	}
	var stop atomic.Bool
	var ops, errs atomic.Uint64
	var first atomic.Value
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			key := fmt.Sprintf("nsl:%d", g)
			for !stop.Load() {
				_, err := l.Allow(ctx, key)
				ops.Add(1)
				if err != nil {
					errs.Add(1)
					first.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		if err := env.Admin.ScriptFlush(ctx).Err(); err != nil {
			stop.Store(true)
			wg.Wait()
			return err
		}
		rep.Flushes++
	}
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	rep.LoadOps, rep.LoadErrs = ops.Load(), errs.Load()
	if m, err := infoFields(ctx, env, "commandstats"); err == nil {
		rep.EvalShaRefused = statFields(m["cmdstat_evalsha"], "rejected_calls", "failed_calls")
		rep.Evals = statFields(m["cmdstat_eval"], "calls")
	}
	if v, ok := first.Load().(string); ok {
		rep.LoadFirstErr = v
	}
	return nil
}

// Markdown writes the report.
func (r *NoScriptReport) Markdown(w io.Writer) {
	fmt.Fprintf(w, "### NOSCRIPT recovery through the AutoPipeliner\n\n")
	for _, s := range r.Single {
		fmt.Fprintf(w, "- %s\n", s)
	}
	fmt.Fprintf(w, "- under load (64 goroutines, token bucket, SCRIPT FLUSH every 100 ms ×%d): %d decisions, %d errors",
		r.Flushes, r.LoadOps, r.LoadErrs)
	if r.LoadFirstErr != "" {
		fmt.Fprintf(w, "; first error: %s", r.LoadFirstErr)
	}
	fmt.Fprintf(w, "; INFO commandstats: EVALSHA %s, EVAL %s\n\n", r.EvalShaRefused, r.Evals)
}

// statFields picks the named fields of an INFO commandstats value.
func statFields(v string, names ...string) string {
	var out []string
	for _, f := range strings.Split(v, ",") {
		if k, _, ok := strings.Cut(f, "="); ok && slices.Contains(names, k) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		return "(none)"
	}
	return strings.Join(out, " ")
}
