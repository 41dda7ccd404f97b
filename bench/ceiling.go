package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
)

// CeilingConfig says how to measure Redis's own ceiling.
type CeilingConfig struct {
	Duration time.Duration // per script and workload; default 1s
	Depth    int           // commands per pipeline; default 32
	Conns    int           // pipelining goroutines; default 4
	NumKeys  int           // keys of the "keys" workload; default 10,000
	// BenchmarkRequests is -n for redis-benchmark (-c 50 -P 16), when it is
	// on the PATH; 0 skips it.
	BenchmarkRequests int
	// Rounds of every command on every workload, interleaved in a new random
	// order each round; the report shows the medians. Default 1.
	Rounds int
	// Only, when set, keeps only the commands whose name it matches (and
	// INCR).
	Only *regexp.Regexp
	// Variants are directories holding other versions of the library's
	// scripts/*.lua: each redlimit script is also measured as built from
	// each of them (same arguments, its own SHA), in the same interleaved
	// rounds, so that a change to the scripts is compared with the scripts
	// in use in one run.
	Variants []string
	// More also measures the contenders of More (warm-up, calendar,
	// priority shares).
	More bool
	Seed uint64
	Log  io.Writer
}

// CeilingRow is one script on one workload, pipelined.
type CeilingRow struct {
	Name, Workload string
	GoOps          float64 // decisions/s of the pipelined Go loop (median over rounds)
	GoAllowed      float64 // share of them allowed (median)
	GoErrs         uint64  // over all rounds
	FirstErr       string
	UsecPerCall    float64 // INFO commandstats usec_per_call of the command (median)
	RedisCPU       float64 // Redis's CPU time (user+sys) / wall time during the Go loop (median)
	// CPUPerOp is Redis's CPU time (user+sys) per decision during the Go
	// loop, µs (median): unlike usec_per_call, a wall-clock figure, it does
	// not grow when the machine preempts Redis mid-script.
	CPUPerOp float64
	// CPUPerOpMin is the least of CPUPerOp over rounds: other jobs on the
	// machine only ever add to it, so with enough rounds it is the most
	// stable estimate of the script's own cost.
	CPUPerOpMin float64
	RBOps       float64 // redis-benchmark requests/s (median), 0 when not run
	RBErr       string
	// Inner are the commands the script called, from INFO commandstats:
	// per decision and µs each (medians over rounds), most time first.
	Inner []InnerCommand

	goOps, goAllowed, usec, cpu, cpuPerOp, rbOps []float64
	inner                                        map[string]*innerSamples
}

// InnerCommand is one command that a script calls.
type InnerCommand struct {
	Name        string
	PerDecision float64 // calls per decision
	UsecPerCall float64 // INFO commandstats usec_per_call
}

type innerSamples struct{ per, usec []float64 }

// CeilingReport is the outcome of Ceiling.
type CeilingReport struct {
	Rows   []CeilingRow
	Config CeilingConfig
	RB     string // redis-benchmark command line shape, or why not run
}

// Ceiling measures how many decisions per second Redis executes for each of
// redlimit's scripts (and, where the server has Redis Functions, its
// functions), its peers' and INCR, EVALSHA and FCALL of `return 1`, when
// the client pipelines: a Go loop of Conns goroutines each sending
// pipelines of Depth commands, and redis-benchmark -c 50 -P 16 when it is
// installed. The scripts' SHA (a function's name) and arguments are taken
// from what the library sends (a go-redis hook records one real decision),
// so they are exactly the ones in use.
func Ceiling(ctx context.Context, env *Env, cfg CeilingConfig) (*CeilingReport, error) {
	if cfg.Duration <= 0 {
		cfg.Duration = time.Second
	}
	if cfg.Depth <= 0 {
		cfg.Depth = 32
	}
	if cfg.Conns <= 0 {
		cfg.Conns = 4
	}
	if cfg.NumKeys <= 0 {
		cfg.NumKeys = 10_000
	}
	rep := &CeilingReport{Config: cfg}
	rb := ceilingRB{}
	rb.path, rep.RB = findRedisBenchmark(cfg)
	rb.host, rb.port, _ = strings.Cut(env.Addr, ":")
	jobs := ceilingJobs(ctx, env, cfg)
	if cfg.Rounds < 1 {
		cfg.Rounds = 1
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0xce11))
	for _, wname := range []string{"one", "keys", "hot"} {
		rows, err := ceilingWorkloadRows(ctx, env, cfg, jobs, wname, rng, rb)
		if err != nil {
			return rep, err
		}
		for _, row := range rows {
			row.summarize()
			rep.Rows = append(rep.Rows, *row)
		}
	}
	return rep, nil
}

// ceilingRB is where redis-benchmark is (path, empty when it is not run),
// and the host and port it is pointed at.
type ceilingRB struct{ path, host, port string }

// findRedisBenchmark returns the path of redis-benchmark when cfg asks for
// it and it is on the PATH, and the report's line about it.
func findRedisBenchmark(cfg CeilingConfig) (path, line string) {
	if cfg.BenchmarkRequests <= 0 {
		return "", "redis-benchmark not run (-rb-requests 0)"
	}
	p, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return "", "redis-benchmark not on the PATH: not run"
	}
	return p, fmt.Sprintf("redis-benchmark -h HOST -p PORT -c 50 -P 16 -n %d -q [-r %d] EVALSHA <sha> 1 <key> <args>", cfg.BenchmarkRequests, cfg.NumKeys)
}

// ceilingJob is one command that Ceiling measures.
type ceilingJob struct {
	name string
	// args returns the command for workload w, with keyPlaceholder
	// where the limited key goes.
	args func(w string) ([]any, error)
	// allowed reads a reply for workload w.
	allowed func(w string, reply any) bool
}

// always reads any reply as allowed.
func always(string, any) bool { return true }

// firstIsOne reads a redis_rate reply: 1 (the cost) first when allowed.
func firstIsOne(_ string, v any) bool {
	a, ok := v.([]any)
	return ok && len(a) > 0 && a[0] == int64(1)
}

// firstIsZero reads a redlimit reply: code 0 first when allowed (an
// array, or packed in a string).
func firstIsZero(_ string, v any) bool {
	if s, ok := v.(string); ok {
		return len(s) > 0 && s[0] == 0
	}
	a, ok := v.([]any)
	return ok && len(a) > 0 && a[0] == int64(0)
}

// ululeAllowed reads a ulule reply, {count, ttl}: allowed while count is
// at most the workload w's rate.
func ululeAllowed(w string, v any) bool {
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return false
	}
	n, ok := a[0].(int64)
	wl, _ := ceilingWorkload(w)
	return ok && n <= int64(wl.Rate)
}

// ceilingJobs returns the commands Ceiling measures: INCR, EVALSHA (and,
// where the server has Redis Functions, FCALL) of `return 1` and of a few
// commands, then each script (and function) of redlimit and of its peers,
// with cfg's variants; only those cfg.Only matches, when set (and INCR).
func ceilingJobs(ctx context.Context, env *Env, cfg CeilingConfig) []ceilingJob {
	var jobs []ceilingJob
	jobs = append(jobs, ceilingJob{"INCR", func(string) ([]any, error) { return []any{"incr", keyPlaceholder}, nil }, always})
	jobs = append(jobs, ceilingJob{"EVALSHA return 1", func(string) ([]any, error) {
		if err := return1.Load(ctx, env.Admin).Err(); err != nil {
			return nil, err
		}
		return []any{"evalsha", return1.Hash(), "1", keyPlaceholder}, nil
	}, always})
	// Redis Functions, where the server has them (Redis 7.0 and later).
	functions := env.Admin.FunctionLoadReplace(ctx, return1Library).Err() == nil
	if functions {
		jobs = append(jobs, ceilingJob{"FCALL return 1", func(string) ([]any, error) {
			return []any{"fcall", "redlimit_bench_return1", "1", keyPlaceholder}, nil
		}, always})
	}
	jobs = append(jobs, ceilingJob{"EVALSHA TIME+GET+SET", func(string) ([]any, error) {
		if err := commandsOnly.Load(ctx, env.Admin).Err(); err != nil {
			return nil, err
		}
		return []any{"evalsha", commandsOnly.Hash(), "1", keyPlaceholder}, nil
	}, always})
	cs := scriptedContenders(functions)
	if cfg.More {
		cs = append(cs, More()...)
	}
	for _, c := range cs {
		jobs = append(jobs, contenderJobs(ctx, env, cfg, c)...)
	}
	if cfg.Only == nil {
		return jobs
	}
	var keep []ceilingJob
	for _, j := range jobs {
		if j.name == "INCR" || cfg.Only.MatchString(j.name) {
			keep = append(keep, j)
		}
	}
	return keep
}

// scriptedContenders returns the contenders whose scripts Ceiling
// measures: redlimit's strategies and policy (also as Redis Functions,
// with functions), and the peers that run on our go-redis client (go-zero
// makes its own).
func scriptedContenders(functions bool) []Contender {
	var scripted []Contender
	for _, s := range redlimit.Strategies() {
		scripted = append(scripted, Redlimit(s, Direct))
	}
	scripted = append(scripted, Policy())
	if functions { // the same as Redis Functions (FCALL)
		for _, s := range redlimit.Strategies() {
			scripted = append(scripted, RedlimitFunctions(s))
		}
		scripted = append(scripted, PolicyFunctions())
	}
	return append(scripted, RedisRate(), Ulule())
}

// contenderJobs returns the jobs of contender c: its script as the
// library sends it, as built from each of cfg's variants (redlimit's
// scripts), and, for the token bucket, written out without the engine.
func contenderJobs(ctx context.Context, env *Env, cfg CeilingConfig, c Contender) []ceilingJob {
	var jobs []ceilingJob
	allowed := firstIsOne
	if c.Kind == "redlimit" {
		allowed = firstIsZero
		variants := cfg.Variants
		if strings.HasSuffix(c.Name, functionsSuffix) {
			variants = nil // a variant replaces a script's SHA
		}
		for _, dir := range variants {
			jobs = append(jobs, ceilingJob{fmt.Sprintf("%s [%s]", c.Name, filepath.Base(dir)), func(w string) ([]any, error) {
				return variantScript(ctx, env, c, w, dir)
			}, allowed})
		}
	}
	if c.Name == Ulule().Name {
		allowed = ululeAllowed
	}
	jobs = append(jobs, ceilingJob{c.Name, func(w string) ([]any, error) { return captureCeiling(ctx, env, c, w) }, allowed})
	if c.Name == tokenBucketName {
		jobs = append(jobs, ceilingJob{"token bucket inlined (no engine)", func(w string) ([]any, error) {
			return inlinedTokenBucketArgs(ctx, env, c, w)
		}, allowed})
	}
	return jobs
}

// inlinedTokenBucketArgs returns the command of the token bucket c's
// decisions for workload w, written out without the engine: its key, taken
// from the library's own command (which carries no argument: n = 1 and
// the others are their defaults, see scripts/common.lua), and its limit,
// the workload's (Burst = Rate), passed as arguments.
func inlinedTokenBucketArgs(ctx context.Context, env *Env, c Contender, w string) ([]any, error) {
	args, err := captureCeiling(ctx, env, c, w)
	if err != nil {
		return nil, err
	}
	if len(args) != 4 || fmt.Sprint(args[2]) != "1" {
		return nil, fmt.Errorf("captured %v, want one key and no argument (the rule written into the script)", args)
	}
	wl, err := ceilingWorkload(w)
	if err != nil {
		return nil, err
	}
	if err := inlinedTokenBucket.Load(ctx, env.Admin).Err(); err != nil {
		return nil, err
	}
	// evalsha sha 1 key | n | rate period burst
	return []any{"evalsha", inlinedTokenBucket.Hash(), "1", args[3], "1",
		wl.Rate, wl.Period.Microseconds(), wl.Rate}, nil
}

// ceilingWorkloadRows measures every job on workload wname, cfg.Rounds
// times, the jobs in a new random order (rng) each round, and returns a
// row per job with its samples.
func ceilingWorkloadRows(ctx context.Context, env *Env, cfg CeilingConfig, jobs []ceilingJob, wname string, rng *rand.Rand, rb ceilingRB) ([]*CeilingRow, error) {
	rows := make([]*CeilingRow, len(jobs))
	cmds := make([][]any, len(jobs))
	for i, j := range jobs {
		if err := env.Admin.FlushAll(ctx).Err(); err != nil {
			return nil, err
		}
		args, err := j.args(wname)
		if err != nil {
			return nil, fmt.Errorf("bench: ceiling %s %s: %w", j.name, wname, err)
		}
		cmds[i] = args
		rows[i] = &CeilingRow{Name: j.name, Workload: wname}
	}
	keys := []string{wname}
	if wname == "keys" {
		keys = make([]string, cfg.NumKeys)
		for i := range keys {
			keys[i] = "user:" + strconv.Itoa(i)
		}
	}
	for round := range cfg.Rounds {
		for _, i := range rng.Perm(len(jobs)) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			j := jobs[i]
			allowed := func(v any) bool { return j.allowed(wname, v) }
			if err := rows[i].measure(ctx, env, cfg, cmds[i], keys, allowed, rb); err != nil {
				return nil, err
			}
		}
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, "ceiling %s round %d/%d done\n", wname, round+1, cfg.Rounds)
		}
	}
	return rows, nil
}

// measure runs args pipelined on keys for cfg.Duration, and redis-benchmark
// when rb has its path, and adds a sample of each figure to row.
func (row *CeilingRow) measure(ctx context.Context, env *Env, cfg CeilingConfig, args []any, keys []string, allowed func(any) bool, rb ceilingRB) error {
	if err := env.Admin.ConfigResetStat(ctx).Err(); err != nil {
		return err
	}
	cpu0, _ := redisCPU(ctx, env)
	t0 := time.Now()
	ops, nAllowed, errs, first := pipelined(ctx, env, cfg, args, keys, allowed)
	el := time.Since(t0)
	cpu1, _ := redisCPU(ctx, env)
	row.goOps = append(row.goOps, float64(ops)/el.Seconds())
	if ops > 0 {
		row.goAllowed = append(row.goAllowed, float64(nAllowed)/float64(ops))
	}
	row.GoErrs += errs
	if row.FirstErr == "" {
		row.FirstErr = first
	}
	row.cpu = append(row.cpu, (cpu1-cpu0)/el.Seconds())
	if ops > 0 {
		row.cpuPerOp = append(row.cpuPerOp, (cpu1-cpu0)*1e6/float64(ops))
	}
	if stats, err := commandStats(ctx, env); err == nil {
		main := strings.ToLower(args[0].(string))
		if st, ok := stats[main]; ok && st.calls > 0 {
			row.usec = append(row.usec, st.usecPerCall)
			row.addInner(stats, main)
		}
	}
	if rb.path != "" {
		ops, err := redisBenchmark(ctx, rb.path, rb.host, rb.port, cfg, args, row.Workload)
		if err != nil {
			row.RBErr = err.Error()
		} else {
			row.rbOps = append(row.rbOps, ops)
		}
	}
	return nil
}

// summarize sets row's figures from its samples: medians, the least CPU
// per decision, and the inner commands, most time first.
func (row *CeilingRow) summarize() {
	row.GoOps, row.GoAllowed = median(row.goOps), median(row.goAllowed)
	row.RedisCPU, row.UsecPerCall, row.RBOps = median(row.cpu), median(row.usec), median(row.rbOps)
	row.CPUPerOp = median(row.cpuPerOp)
	if len(row.cpuPerOp) > 0 {
		row.CPUPerOpMin = slices.Min(row.cpuPerOp)
	}
	for name, in := range row.inner {
		row.Inner = append(row.Inner, InnerCommand{name, median(in.per), median(in.usec)})
	}
	slices.SortFunc(row.Inner, func(a, b InnerCommand) int {
		return cmp.Compare(b.PerDecision*b.UsecPerCall, a.PerDecision*a.UsecPerCall)
	})
}

// addInner records the commands run by the script, per call of main.
func (row *CeilingRow) addInner(stats map[string]cmdStat, main string) {
	if row.inner == nil {
		row.inner = map[string]*innerSamples{}
	}
	mainCalls := float64(stats[main].calls)
	for name, st := range stats {
		switch {
		case name == main, name == "info", name == "hello", name == "ping",
			strings.HasPrefix(name, "config|"), strings.HasPrefix(name, "client|"):
			continue // the decision itself, and the harness's and go-redis's own calls
		}
		in := row.inner[name]
		if in == nil {
			in = &innerSamples{}
			row.inner[name] = in
		}
		in.per = append(in.per, float64(st.calls)/mainCalls)
		in.usec = append(in.usec, st.usecPerCall)
	}
}

// variantScript captures the command of contender c for workload w, as
// captureScript does, and replaces the script's SHA by that of the same
// parts read from dir (loaded into Redis here).
func variantScript(ctx context.Context, env *Env, c Contender, w, dir string) ([]any, error) {
	wl, err := ceilingWorkload(w)
	if err != nil {
		return nil, err
	}
	args, err := captureScript(ctx, env, c, wl)
	if err != nil {
		return nil, err
	}
	sha, err := loadVariant(ctx, env, c, wl, dir)
	if err != nil {
		return nil, err
	}
	args[1] = sha
	return args, nil
}

const keyPlaceholder = "\x00KEY\x00"

// captureScript makes one decision of contender c for workload w on a client
// whose hook records the EVALSHA (or, with Redis Functions, the FCALL) the
// contender sends, and returns it with the limited key replaced by
// keyPlaceholder. (A function's library, loaded by that decision, stays
// loaded: FLUSHALL keeps it.)
func captureScript(ctx context.Context, env *Env, c Contender, w *Workload) ([]any, error) {
	hook := &captureHook{}
	if err := capture(ctx, env, c, w, hook); err != nil {
		return nil, err
	}
	args := hook.get()
	if len(args) < 4 || !isScriptCall(fmt.Sprint(args[0])) {
		return nil, fmt.Errorf("captured %v, want an EVALSHA or FCALL", args)
	}
	key := fmt.Sprint(args[3])
	tmpl := strings.Replace(key, captureKey, keyPlaceholder, 1)
	if tmpl == key {
		return nil, fmt.Errorf("key %q does not hold %q", key, captureKey)
	}
	args[3] = tmpl
	return args, nil
}

// captureCeiling is captureScript for the ceiling's workload w (see
// ceilingWorkload).
func captureCeiling(ctx context.Context, env *Env, c Contender, w string) ([]any, error) {
	wl, err := ceilingWorkload(w)
	if err != nil {
		return nil, err
	}
	return captureScript(ctx, env, c, wl)
}

// captureSource makes one decision of contender c for workload w, as
// captureScript does, and returns the source of the script it runs (with
// w's limit written in, for a limiter that writes its rules into its
// script).
func captureSource(ctx context.Context, env *Env, c Contender, w *Workload) (string, error) {
	hook := &captureHook{source: true}
	if err := capture(ctx, env, c, w, hook); err != nil {
		return "", err
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if hook.src == "" {
		return "", fmt.Errorf("%s sent no EVAL after a NOSCRIPT", c.Name)
	}
	return hook.src, nil
}

// captureKey is the key of the decision that capture makes.
const captureKey = "capture"

// capture makes one decision of contender c for workload w, on key
// captureKey, through a client of its own with hook.
func capture(ctx context.Context, env *Env, c Contender, w *Workload, hook *captureHook) error {
	opts := *env.RDB.Options()
	rdb := redis.NewClient(&opts)
	defer rdb.Close()
	rdb.AddHook(hook)
	wl := *w
	wl.Keys = []string{captureKey}
	dec, release, err := c.Setup(&Env{Addr: env.Addr, RDB: rdb}, &wl)
	if err != nil {
		return err
	}
	if release != nil {
		defer release()
	}
	_, err = dec(ctx, 0)
	return err
}

// ceilingWorkload is workload w with one key; the hot key's limit is 100/s,
// offered far more.
func ceilingWorkload(w string) (*Workload, error) { return MakeWorkload(w, 1, 100) }

// return1Library is the function floor: a Redis Function that returns 1,
// what an FCALL costs Redis before the function does anything.
const return1Library = "#!lua name=redlimit_bench_return1\n" +
	"redis.register_function('redlimit_bench_return1', function() return 1 end)\n"

// isScriptCall reports whether a command named name (any case) runs a
// script or a function: EVALSHA or FCALL.
func isScriptCall(name string) bool {
	return strings.EqualFold(name, "evalsha") || strings.EqualFold(name, "fcall")
}

// captureHook records the first EVALSHA or FCALL. With source set, it sends that
// EVALSHA with a SHA that no script has, so that go-redis sends the
// script's source in an EVAL, and records the source.
type captureHook struct {
	mu     sync.Mutex
	args   []any
	source bool
	src    string
}

// noSuchSHA is the SHA1 of no script loaded here.
const noSuchSHA = "0000000000000000000000000000000000000000"

func (h *captureHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *captureHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a := cmd.Args()
		if len(a) < 2 {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		switch name := strings.ToLower(fmt.Sprint(a[0])); {
		case isScriptCall(name) && h.args == nil:
			h.args = append([]any(nil), a...)
			if h.source && name == "evalsha" {
				a[1] = noSuchSHA
			}
		case name == "eval" && h.source && h.src == "":
			h.src = fmt.Sprint(a[1])
		}
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *captureHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *captureHook) get() []any {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]any(nil), h.args...)
}

// withKey returns args with keyPlaceholder replaced by key.
func withKey(args []any, key string) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if s, ok := a.(string); ok && strings.Contains(s, keyPlaceholder) {
			a = strings.Replace(s, keyPlaceholder, key, 1)
		}
		out[i] = a
	}
	return out
}

// pipelined runs cfg.Conns goroutines that each send pipelines of cfg.Depth
// copies of args (over keys, round-robin) for cfg.Duration.
func pipelined(ctx context.Context, env *Env, cfg CeilingConfig, args []any, keys []string, isAllowed func(any) bool) (ops, allowed, errs uint64, first string) {
	cmds := make([][]any, len(keys))
	for i, k := range keys {
		cmds[i] = withKey(args, k)
	}
	var stop atomic.Bool
	var nOps, nAllowed, nErrs atomic.Uint64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for g := range cfg.Conns {
		wg.Go(func() {
			pipe := env.RDB.Pipeline()
			k := g * 7919
			for !stop.Load() {
				for range cfg.Depth {
					pipe.Do(ctx, cmds[k%len(cmds)]...)
					k++
				}
				res, _ := pipe.Exec(ctx)
				var o, a, e uint64
				for _, c := range res {
					o++
					v, err := c.(*redis.Cmd).Result()
					if err != nil {
						e++
						firstErr.CompareAndSwap(nil, err.Error())
						continue
					}
					if isAllowed(v) {
						a++
					}
				}
				nOps.Add(o)
				nAllowed.Add(a)
				nErrs.Add(e)
			}
		})
	}
	select {
	case <-time.After(cfg.Duration):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	if v, ok := firstErr.Load().(string); ok {
		first = v
	}
	return nOps.Load(), nAllowed.Load(), nErrs.Load(), first
}

func infoFields(ctx context.Context, env *Env, section string) (map[string]string, error) {
	info, err := env.Admin.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m, nil
}

// redisCPU returns the server's used_cpu_user + used_cpu_sys, in seconds.
func redisCPU(ctx context.Context, env *Env) (float64, error) {
	m, err := infoFields(ctx, env, "cpu")
	if err != nil {
		return 0, err
	}
	u, err1 := strconv.ParseFloat(m["used_cpu_user"], 64)
	s, err2 := strconv.ParseFloat(m["used_cpu_sys"], 64)
	return u + s, errors.Join(err1, err2)
}

// usecPerCall returns INFO commandstats' usec_per_call of cmd: the time
// Redis spent executing it (for EVALSHA, the script), not parsing or I/O.
func usecPerCall(ctx context.Context, env *Env, cmd string) (float64, error) {
	stats, err := commandStats(ctx, env)
	if err != nil {
		return 0, err
	}
	st, ok := stats[cmd]
	if !ok || st.calls == 0 {
		return 0, fmt.Errorf("no cmdstat_%s", cmd)
	}
	return st.usecPerCall, nil
}

// cmdStat is one line of INFO commandstats. Redis counts the commands a
// script calls there too, and includes their time in the script's.
type cmdStat struct {
	calls       int64
	usecPerCall float64
}

// commandStats returns INFO commandstats by command name (lower case;
// subcommands as "config|resetstat").
func commandStats(ctx context.Context, env *Env) (map[string]cmdStat, error) {
	m, err := infoFields(ctx, env, "commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]cmdStat{}
	for k, v := range m {
		name, ok := strings.CutPrefix(k, "cmdstat_")
		if !ok {
			continue
		}
		var st cmdStat
		for _, f := range strings.Split(v, ",") {
			if x, ok := strings.CutPrefix(f, "calls="); ok {
				st.calls, _ = strconv.ParseInt(x, 10, 64)
			} else if x, ok := strings.CutPrefix(f, "usec_per_call="); ok {
				st.usecPerCall, _ = strconv.ParseFloat(x, 64)
			}
		}
		out[name] = st
	}
	return out, nil
}

var rbRate = regexp.MustCompile(`([0-9.]+) requests per second`)

// redisBenchmark runs redis-benchmark -c 50 -P 16 on the command, with a
// random key among cfg.NumKeys for the "keys" workload.
func redisBenchmark(ctx context.Context, path, host, port string, cfg CeilingConfig, args []any, wname string) (float64, error) {
	key := wname
	rb := []string{"-h", host, "-p", port, "-c", "50", "-P", "16", "-n", strconv.Itoa(cfg.BenchmarkRequests), "-q"}
	if wname == "keys" {
		key = "user:__rand_int__"
		rb = append(rb, "-r", strconv.Itoa(cfg.NumKeys))
	}
	for _, a := range withKey(args, key) {
		rb = append(rb, fmt.Sprint(a))
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, rb...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w: %s", err, lastLine(string(out)))
	}
	m := rbRate.FindAllStringSubmatch(string(out), -1)
	if len(m) == 0 {
		return 0, fmt.Errorf("redis-benchmark: no rate in %q", lastLine(string(out)))
	}
	return strconv.ParseFloat(m[len(m)-1][1], 64)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexAny(s, "\r\n"); i >= 0 {
		return s[i+1:]
	}
	return s
}

// Markdown writes the report.
func (r *CeilingReport) Markdown(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "### Redis's ceiling for our scripts (pipelined)\n\n")
	fmt.Fprintf(w, "Median over %d interleaved round(s). Go loop: %d goroutines, each sending pipelines of %d commands for %v. "+
		"µs/call: INFO commandstats usec_per_call (time inside the command or script, without parsing and I/O); "+
		"1e6/µs is the bound if Redis did nothing else. Redis CPU: its user+sys CPU seconds per wall second during the Go loop "+
		"(1.0 = one core saturated); Redis CPU µs/decision: that CPU time per decision, parsing and I/O included, "+
		"which, unlike µs/call (wall-clock), does not grow when the machine preempts Redis, and its least over the rounds "+
		"(other jobs only add to it). redis-benchmark: %s.\n\n", c.Rounds, c.Conns, c.Depth, c.Duration, r.RB)
	fmt.Fprintf(w, "| workload | command | Go pipelined ops/s | allowed | Redis CPU | Redis CPU µs/decision | (least) | µs/call | 1e6/µs | redis-benchmark ops/s |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range r.Rows {
		bound := "–"
		if row.UsecPerCall > 0 {
			bound = fmt.Sprintf("%.0f", 1e6/row.UsecPerCall)
		}
		rb := "–"
		if row.RBOps > 0 {
			rb = fmt.Sprintf("%.0f", row.RBOps)
		} else if row.RBErr != "" {
			rb = "error"
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %.1f%% | %.2f | %.2f | %.2f | %.2f | %s | %s |\n",
			row.Workload, row.Name, row.GoOps, 100*row.GoAllowed, row.RedisCPU, row.CPUPerOp, row.CPUPerOpMin, row.UsecPerCall, bound, rb)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "What the scripts call (INFO commandstats of the commands run inside them, which Redis counts apart and includes in the script's µs/call): "+
		"calls per decision × µs each.\n\n")
	fmt.Fprintf(w, "| workload | command | µs/call | inside it |\n|---|---|---:|---|\n")
	for _, row := range r.Rows {
		if len(row.Inner) == 0 {
			continue
		}
		var parts []string
		sum := 0.0
		for _, in := range row.Inner {
			parts = append(parts, fmt.Sprintf("%s %.2g×%.2f", strings.ToUpper(in.Name), in.PerDecision, in.UsecPerCall))
			sum += in.PerDecision * in.UsecPerCall
		}
		fmt.Fprintf(w, "| %s | %s | %.2f | %s (sum %.2f; the rest, %.2f, is Lua and the call) |\n",
			row.Workload, row.Name, row.UsecPerCall, strings.Join(parts, ", "), sum, row.UsecPerCall-sum)
	}
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		if row.GoErrs > 0 || row.RBErr != "" {
			fmt.Fprintf(w, "- %s %s: %d Go errors (%s) %s\n", row.Workload, row.Name, row.GoErrs, row.FirstErr, row.RBErr)
		}
	}
}
