package bench

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
	ulule "github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
	gzlimit "github.com/zeromicro/go-zero/core/limit"
	"github.com/zeromicro/go-zero/core/logx"
	gzredis "github.com/zeromicro/go-zero/core/stores/redis"
)

func init() {
	// Importing go-zero starts its stat goroutine, which logs CPU and memory
	// to stdout every minute, and its limiters log every Redis error: keep
	// that out of the report.
	logx.Disable()
}

// Contenders returns everything the default comparison measures: the five
// redlimit strategies, the peers, and the two floors.
func Contenders() []Contender {
	var cs []Contender
	for _, s := range redlimit.Strategies() {
		cs = append(cs, Redlimit(s, Direct))
	}
	cs = append(cs, Policy())
	for _, s := range redlimit.Strategies() {
		cs = append(cs, RedlimitFunctions(s))
	}
	cs = append(cs, PolicyFunctions())
	cs = append(cs, RedisRate(), GoZeroToken(), GoZeroPeriod(), Ulule())
	cs = append(cs, Incr(Direct), EvalReturn1(Direct))
	return cs
}

// More returns the redlimit contenders beyond Contenders' strategies and
// policy that a default limiter does not run: each warming bucket, the
// calendar quotas, and each strategy's call with a priority share
// (Sheddable). cmd/instructions always counts them; cmd/compare measures
// them with -more.
func More() []Contender {
	cs := []Contender{RedlimitWarmUp(redlimit.TokenBucket), RedlimitWarmUp(redlimit.LeakyBucket), Calendar()}
	cs = append(cs, CalendarShifting()...)
	for _, s := range redlimit.Strategies() {
		cs = append(cs, RedlimitSheddable(s))
	}
	return cs
}

// Via chooses the client a contender sends its commands through.
type Via int

const (
	// Direct uses Env.RDB, one pooled connection per command in flight.
	Direct Via = iota
	// ViaAutoPipeline uses Env.AP, go-redis's experimental AutoPipeliner,
	// which batches the commands of concurrent callers.
	ViaAutoPipeline
)

func (v Via) client(env *Env) (redis.UniversalClient, error) {
	if v == ViaAutoPipeline {
		if env.AP == nil {
			return nil, errors.New("no AutoPipeliner in this environment")
		}
		return env.AP, nil
	}
	return env.RDB, nil
}

func (v Via) suffix() string {
	if v == ViaAutoPipeline {
		return " via AutoPipeliner"
	}
	return ""
}

// Redlimit measures one redlimit strategy. The fallback policy is
// FallbackError, so that a Redis failure shows as an error instead of a fast
// in-process answer.
func Redlimit(s redlimit.Strategy, via Via) Contender {
	return redlimitWith(s, via, "")
}

// RedlimitClientClock measures one redlimit strategy with
// redlimit.WithClientClock: the limiter sends the time, measured with TIME,
// instead of the script reading it.
func RedlimitClientClock(s redlimit.Strategy) Contender {
	return redlimitWith(s, Direct, " (client clock)", redlimit.WithClientClock())
}

// RedlimitWarmUp measures a token or leaky bucket with a warm-up
// (Limit.WarmUp): 100,000 a second with a warm-up of a second, whatever the
// workload (a warm-up bounds Rate × Period; cold, it still admits 33,000
// a second, more than decisions one at a time reach), on a key of its own.
func RedlimitWarmUp(s redlimit.Strategy) Contender {
	return Contender{
		Name:     "redlimit " + s.String() + " (warm-up)",
		Kind:     "redlimit",
		Scripted: true,
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			lim := redlimit.Limit{Rate: 100_000, Period: time.Second, WarmUp: time.Second}
			if s == redlimit.LeakyBucket {
				lim.Burst = 1_000_000
			}
			l, err := redlimit.New(env.RDB, s, lim, redlimit.WithFallback(redlimit.FallbackError), redlimit.WithPrefix("redlimit-warmup"))
			if err != nil {
				return nil, nil, err
			}
			return allowDecider(l, w.Keys)
		},
	}
}

// allowDecider returns the Decider that asks l to Allow the workload's
// keys, and a function that closes l.
func allowDecider(l redlimit.Limiter, keys []string) (Decider, func(), error) {
	dec := func(ctx context.Context, i int) (bool, error) {
		res, err := l.Allow(ctx, keys[i])
		return res.Allowed, err
	}
	return dec, func() { _ = l.Close() }, nil // what Close says changes no figure
}

// functionsSuffix ends the names of the contenders with
// redlimit.WithRedisFunctions.
const functionsSuffix = " (functions)"

// RedlimitFunctions measures one redlimit strategy deciding with a Redis
// Function (redlimit.WithRedisFunctions) instead of a script.
func RedlimitFunctions(s redlimit.Strategy) Contender {
	return redlimitWith(s, Direct, functionsSuffix, redlimit.WithRedisFunctions())
}

// RedlimitSheddable measures one redlimit strategy with
// redlimit.WithPriorityShares(0.5, 0.8), every call Sheddable: the cost of
// a call's priority share (one more script argument, and the share applied
// to the rule's capacity).
func RedlimitSheddable(s redlimit.Strategy) Contender {
	c := redlimitWith(s, Direct, " (sheddable)", redlimit.WithPriorityShares(0.5, 0.8))
	setup := c.Setup
	c.Setup = func(env *Env, w *Workload) (Decider, func(), error) {
		dec, done, err := setup(env, w)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, i int) (bool, error) {
			return dec(redlimit.ContextWithPriority(ctx, redlimit.Sheddable), i)
		}, done, nil
	}
	return c
}

// RedlimitRegions is redlimit's strategy s with WithRegions, its one peer
// an embedded miniredis: what journaling each admitted call costs the
// region's Redis (and, every interval, reading the journal of each key
// decided), the exchange's calls landing on the peer.
func RedlimitRegions(s redlimit.Strategy) Contender {
	c := redlimitWith(s, Direct, " (regions)")
	c.Setup = func(env *Env, w *Workload) (Decider, func(), error) {
		peer, err := miniredis.Run()
		if err != nil {
			return nil, nil, err
		}
		prdb := redis.NewClient(&redis.Options{Addr: peer.Addr()})
		opt := redlimit.WithRegions(redlimit.Regions{Name: "here", Peers: map[string]redis.UniversalClient{"there": prdb}})
		dec, done, err := redlimitWith(s, Direct, "", opt).Setup(env, w)
		if err != nil {
			_ = prdb.Close()
			peer.Close()
			return nil, nil, err
		}
		return dec, func() { done(); _ = prdb.Close(); peer.Close() }, nil
	}
	return c
}

func redlimitWith(s redlimit.Strategy, via Via, suffix string, opts ...redlimit.Option) Contender {
	return Contender{
		Name:     "redlimit " + s.String() + via.suffix() + suffix,
		Kind:     "redlimit",
		Scripted: true,
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			rdb, err := via.client(env)
			if err != nil {
				return nil, nil, err
			}
			lim := redlimit.Limit{Rate: w.Rate, Period: w.Period}
			if s == redlimit.SlidingLog && lim.Rate > redlimit.MaxSlidingLogRate {
				// Its most, per second: more than this machine reaches, so
				// it never denies, and events leave the log as they would
				// in use. (Capped at the workload's Period, 10,000 s, it
				// would deny after 100,000 events, a few seconds here.)
				lim = redlimit.Limit{Rate: redlimit.MaxSlidingLogRate, Period: time.Second}
			}
			l, err := redlimit.New(rdb, s, lim, append(opts, redlimit.WithFallback(redlimit.FallbackError))...)
			if err != nil {
				return nil, nil, err
			}
			return allowDecider(l, w.Keys)
		},
	}
}

// tokenBucketName is the single token bucket's contender name, the base of
// the policy's ratio.
var tokenBucketName = Redlimit(redlimit.TokenBucket, Direct).Name

// policyBases maps each policy contender to the single token bucket it is
// compared with: the one that decides the same way (script or function).
var policyBases = map[string]string{
	PolicyName:                   tokenBucketName,
	PolicyName + functionsSuffix: tokenBucketName + functionsSuffix,
}

// PolicyName is the name of the Policy contender.
const PolicyName = "redlimit policy (3 rules)"

// Policy measures a redlimit Policy of three rules on every key, decided in
// one script call: a token bucket of the workload's limit (the single token
// bucket contender's), a sliding counter per minute and a fixed window per
// hour at 100 and 10,000 times the bucket's rate. Neither of the last two
// denies in any workload here, so the token bucket decides, and the ratio
// to the single token bucket is the cost of the two extra rules. Its keys
// have a prefix of their own, so that its bucket is not the single one's.
func Policy() Contender {
	return policyWith(PolicyName)
}

// PolicyFunctions measures the Policy contender's rules deciding with a
// Redis Function (redlimit.WithRedisFunctions).
func PolicyFunctions() Contender {
	return policyWith(PolicyName+functionsSuffix, redlimit.WithRedisFunctions())
}

func policyWith(name string, opts ...redlimit.Option) Contender {
	return Contender{
		Name:     name,
		Kind:     "redlimit",
		Scripted: true,
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			scaled := func(factor float64, period time.Duration) redlimit.Limit {
				r := float64(w.Rate) * factor * float64(period) / float64(w.Period)
				return redlimit.Limit{Rate: int(max(1, min(r, redlimit.MaxRate))), Period: period}
			}
			p, err := redlimit.NewPolicy(env.RDB, []redlimit.Rule{
				{Strategy: redlimit.TokenBucket, Limit: redlimit.Limit{Rate: w.Rate, Period: w.Period}},
				{Strategy: redlimit.SlidingCounter, Limit: scaled(100, time.Minute)},
				{Strategy: redlimit.FixedWindow, Limit: scaled(10_000, time.Hour)},
			}, append(opts, redlimit.WithFallback(redlimit.FallbackError), redlimit.WithPrefix("redlimit-policy"))...)
			if err != nil {
				return nil, nil, err
			}
			return allowDecider(p, w.Keys)
		},
	}
}

// Variant measures contender c (a redlimit one) with its script rebuilt
// from the same files in dir, another copy of the library's scripts/: its
// client swaps the script's SHA for the variant's in every EVALSHA, so that
// the library, arguments and reply decoding stay the same. Compared with c
// in the same interleaved rounds, it measures a change to the scripts
// unpipelined.
func Variant(c Contender, dir string) Contender {
	v := c
	v.Name = fmt.Sprintf("%s [%s]", c.Name, filepath.Base(dir))
	v.Setup = func(env *Env, w *Workload) (Decider, func(), error) {
		ctx := context.Background()
		args, err := captureScript(ctx, env, c, w)
		if err != nil {
			return nil, nil, err
		}
		from := fmt.Sprint(args[1])
		to, err := loadVariant(ctx, env, c, w, dir)
		if err != nil {
			return nil, nil, err
		}
		opts := *env.RDB.Options()
		rdb := redis.NewClient(&opts)
		rdb.AddHook(shaSwap{from, to})
		venv := &Env{Addr: env.Addr, Miniredis: env.Miniredis, RDB: rdb, Admin: env.Admin}
		dec, release, err := c.Setup(venv, w)
		if err != nil {
			rdb.Close()
			return nil, nil, err
		}
		return dec, func() {
			if release != nil {
				release()
			}
			rdb.Close()
		}, nil
	}
	return v
}

// loadVariant loads the script of contender c for workload w with every
// part of the library's scripts/ replaced by the file of the same name in
// dir, and returns its SHA. It starts from the script the library sends
// for w (captured from the EVAL that follows a NOSCRIPT), so that what the
// library writes into a script (a limiter's rules, w's limit) stays as it
// is. (Captured for another workload, a variant of the hot key ran at the
// other's limit, and filled the key that its contender shares.)
func loadVariant(ctx context.Context, env *Env, c Contender, w *Workload, dir string) (string, error) {
	if !c.Scripted {
		return "", fmt.Errorf("%s has no scripts to vary", c.Name)
	}
	src, err := captureSource(ctx, env, c, w)
	if err != nil {
		return "", err
	}
	lib, err := libraryScripts()
	if err != nil {
		return "", err
	}
	replaced := 0
	for _, name := range slices.Sorted(maps.Keys(lib)) {
		if !strings.Contains(src, lib[name]) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", err
		}
		src = strings.ReplaceAll(src, lib[name], string(b)) // check.lua: once per rule written in
		replaced++
	}
	if replaced == 0 {
		return "", fmt.Errorf("the script of %s holds none of the library's scripts/*.lua as they are on disk", c.Name)
	}
	sha, err := env.Admin.ScriptLoad(ctx, src).Result()
	if err != nil {
		return "", fmt.Errorf("SCRIPT LOAD of %s from %s: %w", c.Name, dir, err)
	}
	return sha, nil
}

// libraryScripts returns the library's scripts/*.lua by name, read from
// the directory of the module this build uses (go.work's copy, or the
// module cache's).
var libraryScripts = sync.OnceValues(func() (map[string]string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/redlimit/redlimit").Output()
	if err != nil {
		return nil, fmt.Errorf("finding the library's directory: go list: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "scripts")
	files, err := filepath.Glob(filepath.Join(dir, "*.lua"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no scripts in %s (%v)", dir, err)
	}
	lib := make(map[string]string, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		lib[filepath.Base(f)] = string(b)
	}
	return lib, nil
})

// shaSwap sends EVALSHA of one script as EVALSHA of another.
type shaSwap struct{ from, to string }

func (h shaSwap) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h shaSwap) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == h.from {
			a[1] = h.to
		}
		return next(ctx, cmd)
	}
}
func (h shaSwap) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func prefixed(prefix string, keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = prefix + k
	}
	return out
}

// RedisRate measures github.com/go-redis/redis_rate/v10: GCRA in one Lua
// script, Redis time, run with Script.Run (EVALSHA) on the shared client.
func RedisRate() Contender {
	return Contender{
		Name: "redis_rate (GCRA)",
		Kind: "peer",
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			rl := redis_rate.NewLimiter(env.RDB)
			limit := redis_rate.Limit{Rate: w.Rate, Burst: w.Rate, Period: w.Period}
			keys := w.Keys // redis_rate prefixes "rate:"
			dec := func(ctx context.Context, i int) (bool, error) {
				res, err := rl.Allow(ctx, keys[i], limit)
				if err != nil {
					return false, err
				}
				return res.Allowed > 0, nil
			}
			return dec, nil, nil
		},
	}
}

// Ulule measures github.com/ulule/limiter/v3 with its go-redis store: a
// fixed window that starts at the first hit (INCRBY + PEXPIRE in Lua).
func Ulule() Contender {
	return Contender{
		Name: "ulule/limiter (fixed window)",
		Kind: "peer",
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			store, err := ulredis.NewStoreWithOptions(env.RDB, ulule.StoreOptions{Prefix: "ulule"})
			if err != nil {
				return nil, nil, err
			}
			lim := ulule.New(store, ulule.Rate{Period: w.Period, Limit: int64(w.Rate)})
			keys := w.Keys
			dec := func(ctx context.Context, i int) (bool, error) {
				c, err := lim.Get(ctx, keys[i])
				if err != nil {
					return false, err
				}
				return !c.Reached, nil
			}
			return dec, nil, nil
		},
	}
}

// gozeroStore is go-zero's own Redis wrapper, pointed at the server under
// test. go-zero builds its go-redis client itself (one per address, shared):
// pool 10×GOMAXPROCS (20 here, as ours), MaxRetries 3, MinIdleConns 8,
// go-redis's default 3 s read timeout, a circuit-breaker hook and a
// duration (metrics and slow-log) hook. None of that can be set from
// outside, so it does not get our tuned options. The hook added here only
// counts errors, which its TokenLimiter hides behind a bool.
type gozeroStore struct {
	rds   *gzredis.Redis
	errs  atomic.Uint64 // failed commands, but NOSCRIPT (which Script.Run recovers from)
	evals atomic.Uint64 // EVALSHA commands that reached the client (past go-zero's breaker)
}

// countHook runs after go-zero's own hooks, so it sees only the commands
// that its circuit breaker let through.
type countHook struct{ gs *gozeroStore }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.gs.evals.Add(1)
		}
		err := next(ctx, cmd)
		if err != nil && !errors.Is(err, redis.Nil) && !strings.HasPrefix(err.Error(), "NOSCRIPT") {
			h.gs.errs.Add(1)
		}
		return err
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (e *Env) gozero() (*gozeroStore, error) {
	e.gzOnce.Do(func() {
		gs := &gozeroStore{}
		rds, err := gzredis.NewRedis(gzredis.RedisConf{Host: e.Addr, Type: gzredis.NodeType},
			gzredis.WithHook(countHook{gs}))
		if err != nil {
			e.gzErr = err
			return
		}
		gs.rds = rds
		e.gz = gs
	})
	return e.gz, e.gzErr
}

func gozeroErrors(env *Env) uint64 {
	if env.gz == nil {
		return 0
	}
	return env.gz.errs.Load()
}

func gozeroEvals(env *Env) uint64 {
	if env.gz == nil {
		return 0
	}
	return env.gz.evals.Load()
}

// perSecond converts a workload's limit to the whole events per second that
// go-zero takes.
func perSecond(w *Workload) (rate, periodSeconds int, err error) {
	if w.Period%time.Second != 0 {
		return 0, 0, fmt.Errorf("go-zero needs a period in whole seconds, not %v", w.Period)
	}
	return int(int64(w.Rate) * int64(time.Second) / int64(w.Period)), int(w.Period / time.Second), nil
}

// GoZeroToken measures go-zero's TokenLimiter (the Stripe-gist token bucket,
// two keys, client clock in whole seconds). It is one limiter per key, so
// the "keys" workload gets one TokenLimiter per key, made before the run.
func GoZeroToken() Contender {
	return Contender{
		Name: "go-zero TokenLimiter",
		Kind: "peer",
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			gs, err := env.gozero()
			if err != nil {
				return nil, nil, err
			}
			rate, _, err := perSecond(w)
			if err != nil {
				return nil, nil, err
			}
			lims := make([]*gzlimit.TokenLimiter, len(w.Keys))
			for i, k := range w.Keys {
				lims[i] = gzlimit.NewTokenLimiter(rate, w.Rate, gs.rds, "gzt:"+k)
			}
			dec := func(ctx context.Context, i int) (bool, error) {
				return lims[i].AllowCtx(ctx), nil
			}
			return dec, nil, nil
		},
		Errors:     gozeroErrors,
		RedisCalls: gozeroEvals,
	}
}

// GoZeroPeriod measures go-zero's PeriodLimit (a fixed window: INCRBY, and
// EXPIRE on the first hit, in Lua).
func GoZeroPeriod() Contender {
	return Contender{
		Name: "go-zero PeriodLimit",
		Kind: "peer",
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			gs, err := env.gozero()
			if err != nil {
				return nil, nil, err
			}
			_, secs, err := perSecond(w)
			if err != nil {
				return nil, nil, err
			}
			pl := gzlimit.NewPeriodLimit(secs, w.Rate, gs.rds, "gzp:")
			keys := w.Keys
			dec := func(ctx context.Context, i int) (bool, error) {
				code, err := pl.TakeCtx(ctx, keys[i])
				if err != nil {
					return false, err
				}
				return code == gzlimit.Allowed || code == gzlimit.HitQuota, nil
			}
			return dec, nil, nil
		},
		Errors: gozeroErrors,
	}
}

// Incr is the first floor: one INCR per decision, the cheapest write a
// limiter could make.
func Incr(via Via) Contender {
	return Contender{
		Name: "INCR" + via.suffix(),
		Kind: "floor",
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			rdb, err := via.client(env)
			if err != nil {
				return nil, nil, err
			}
			keys := prefixed("incr:", w.Keys)
			dec := func(ctx context.Context, i int) (bool, error) {
				return true, rdb.Incr(ctx, keys[i]).Err()
			}
			return dec, nil, nil
		},
	}
}

var return1 = redis.NewScript("return 1")

// commandsOnly calls what a bucket script calls (TIME, GET, SET with PX) and
// computes nothing: the least a GCRA or token-bucket script can cost Redis,
// measured by -ceiling next to the real scripts.
var commandsOnly = redis.NewScript(`local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], '1234567890123', 'PX', 60000)
return 1`)

// inlinedTokenBucket is the token bucket's common path without the engine
// (see inlined_token_bucket.lua), measured by -ceiling to show what the
// engine costs Redis.
//
//go:embed inlined_token_bucket.lua
var inlinedTokenBucketSrc string

var inlinedTokenBucket = redis.NewScript(inlinedTokenBucketSrc)

// EvalReturn1 is the second floor: EVALSHA of a script that does nothing,
// the cost of running any script at all.
func EvalReturn1(via Via) Contender {
	return Contender{
		Name: "EVALSHA return 1" + via.suffix(),
		Kind: "floor",
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			rdb, err := via.client(env)
			if err != nil {
				return nil, nil, err
			}
			keys := prefixed("e1:", w.Keys)
			dec := func(ctx context.Context, i int) (bool, error) {
				return true, return1.Run(ctx, rdb, keys[i:i+1]).Err()
			}
			return dec, nil, nil
		},
	}
}

// CalendarName is the name of the Calendar contender.
const CalendarName = "redlimit fixed-window daily (calendar)"

// Calendar measures a calendar quota: a fixed window of the workload's
// rate per day in Asia/Tokyo (redlimit.Daily), a zone of one offset, whose
// windows the fixed window's script computes itself.
func Calendar() Contender {
	return calendarIn(CalendarName, "Asia/Tokyo", func(rate int, loc *time.Location) redlimit.Limit {
		return redlimit.Daily(rate, loc)
	})
}

// CalendarShifting measures the calendar quotas whose limiter sends the
// window with each call: a day and a month (from the 1st) of the
// workload's rate in America/New_York, a zone with daylight saving.
func CalendarShifting() []Contender {
	return []Contender{
		calendarIn("redlimit fixed-window daily (calendar, New York)", "America/New_York", func(rate int, loc *time.Location) redlimit.Limit {
			return redlimit.Daily(rate, loc)
		}),
		calendarIn("redlimit fixed-window monthly (calendar, New York)", "America/New_York", func(rate int, loc *time.Location) redlimit.Limit {
			return redlimit.Monthly(rate, loc, 1)
		}),
	}
}

func calendarIn(name, zone string, limit func(rate int, loc *time.Location) redlimit.Limit) Contender {
	return Contender{
		Name:     name,
		Kind:     "redlimit",
		Scripted: true,
		Setup: func(env *Env, w *Workload) (Decider, func(), error) {
			loc, err := time.LoadLocation(zone)
			if err != nil {
				return nil, nil, err
			}
			l, err := redlimit.NewFixedWindow(env.RDB, limit(w.Rate, loc),
				redlimit.WithFallback(redlimit.FallbackError), redlimit.WithPrefix("redlimit-calendar"))
			if err != nil {
				return nil, nil, err
			}
			return allowDecider(l, w.Keys)
		},
	}
}
