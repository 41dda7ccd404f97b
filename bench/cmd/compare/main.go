// Command compare measures redlimit against its peers and the plainest Redis
// round trips, on a redis-server it starts itself on a free loopback port
// (or an embedded miniredis with -miniredis). See bench/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redlimit/redlimit/bench"
	"github.com/redlimit/redlimit/internal/redistest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// The command's flags.
var (
	rounds     = flag.Int("rounds", 3, "interleaved rounds; the tables show the median")
	duration   = flag.Duration("duration", 900*time.Millisecond, "run time per contender per round")
	warmup     = flag.Duration("warmup", 100*time.Millisecond, "warm-up per contender before the first round of each block")
	concFlag   = flag.String("conc", "1,8,64", "concurrency levels (goroutines), comma-separated")
	workloads  = flag.String("workloads", "one,keys,hot", "workloads: one, keys, hot")
	only       = flag.String("only", "", "regexp: measure only the contenders whose name matches (the INCR floor is always kept)")
	hotRate    = flag.Int("hot-rate", 0, "limit per second of the hot workload; 0 = EVALSHA `return 1` throughput / 100, calibrated per concurrency")
	numKeys    = flag.Int("keys", 10_000, "keys of the keys workload")
	useMini    = flag.Bool("miniredis", false, "run against an embedded miniredis instead of redis-server (measures the library and client, not Redis)")
	memory     = flag.Bool("memory", false, "measure the Redis memory each limiter keeps per key, instead of throughput")
	ceiling    = flag.Bool("ceiling", false, "measure how many decisions/s Redis executes for each of our scripts and functions when pipelined")
	autopipe   = flag.Bool("autopipeline", false, "run the redlimit strategies through go-redis's AutoPipeliner (concurrency from -conc, default 64,512)")
	depth      = flag.Int("pipeline", 32, "-ceiling: commands per pipeline")
	conns      = flag.Int("conns", 4, "-ceiling: pipelining goroutines (connections)")
	rbN        = flag.Int("rb-requests", 100_000, "-ceiling: requests per redis-benchmark run (0 = skip redis-benchmark)")
	more       = flag.Bool("more", false, "also measure redlimit's warming buckets, calendar quota and each strategy's call with a priority share (bench.More)")
	variants   = flag.String("variants", "", "comma-separated directories holding other versions of the library's scripts/*.lua: each redlimit contender is also measured with its script built from them, in the same rounds (also with -ceiling)")
	out        = flag.String("out", "", "also write the Markdown report to this file")
	cpuprofile = flag.String("cpuprofile", "", "write a CPU profile of this process to the file")
	seed       = flag.Uint64("seed", uint64(time.Now().UnixNano()), "seed of the shuffled order")
	timeout    = flag.Duration("timeout", 2*time.Second, "the contenders' client dial, read, write and pool timeouts (the README recommends 100ms in production; a shared 2-core machine needs more, or a busy moment fails calls and the fallback answers them)")
)

// run does the work, so that its deferred calls (which stop redis-server)
// run before the process exits.
func run() (err error) {
	flag.Parse()
	concSet := false
	flag.Visit(func(f *flag.Flag) { concSet = concSet || f.Name == "conc" })
	if *autopipe && !concSet {
		*concFlag = "64,512"
	}
	conc, err := parseInts(*concFlag)
	if err != nil {
		return err
	}
	var onlyRe *regexp.Regexp
	if *only != "" {
		if onlyRe, err = regexp.Compile(*only); err != nil {
			return err
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	env, closeEnv, err := newEnv()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeEnv()) }()
	if *cpuprofile != "" {
		stopProfile, err := startProfile(*cpuprofile)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, stopProfile()) }()
	}

	var sb strings.Builder
	w := io.MultiWriter(os.Stdout, &sb)
	server := "redis-server " + serverVersion(env) + " at " + env.Addr
	if *useMini {
		server = "embedded miniredis at " + env.Addr
	}
	fmt.Fprintf(w, "<!-- %s; %s -->\n\n", server, time.Now().Format(time.RFC3339))
	if err := report(ctx, env, w, conc, onlyRe); err != nil {
		return err
	}
	if *out != "" {
		return os.WriteFile(*out, []byte(sb.String()), 0o644)
	}
	return nil
}

// newEnv starts the server the flags ask for, redis-server or an embedded
// miniredis, and returns the benchmark's environment on it, and a
// function that closes the environment and stops the server.
func newEnv() (*bench.Env, func() error, error) {
	var addr string
	var stopServer func() error
	if *useMini {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, nil, err
		}
		addr, stopServer = m.Addr(), func() error { m.Close(); return nil }
	} else {
		s, err := redistest.StartServer()
		if err != nil {
			return nil, nil, err
		}
		addr, stopServer = s.Addr, s.Close
	}
	opts := redistest.TunedOptions(addr)
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout, opts.PoolTimeout = *timeout, *timeout, *timeout, *timeout
	env, err := bench.NewEnv(addr, opts, *useMini)
	if err != nil {
		return nil, nil, errors.Join(err, stopServer())
	}
	return env, func() error { env.Close(); return stopServer() }, nil
}

// startProfile starts a CPU profile of this process into the file at path,
// and returns the function that ends it.
func startProfile(path string) (func() error, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return func() error { pprof.StopCPUProfile(); return f.Close() }, nil
}

// report measures what the flags ask for (memory, the ceiling, or the
// contenders' throughput) and writes the report to w.
func report(ctx context.Context, env *bench.Env, w io.Writer, conc []int, onlyRe *regexp.Regexp) error {
	switch {
	case *memory:
		if *useMini {
			return fmt.Errorf("-memory needs redis-server: miniredis has no MEMORY USAGE")
		}
		rep, err := bench.Memory(ctx, env, *numKeys)
		if err != nil {
			return err
		}
		rep.Markdown(w)
	case *ceiling:
		if *useMini {
			return fmt.Errorf("-ceiling needs redis-server: it measures Redis itself")
		}
		rep, err := bench.Ceiling(ctx, env, bench.CeilingConfig{
			Duration: *duration, Depth: *depth, Conns: *conns, NumKeys: *numKeys,
			BenchmarkRequests: *rbN, Rounds: *rounds, Only: onlyRe, Seed: *seed, Log: os.Stderr,
			Variants: splitList(*variants), More: *more,
		})
		if err != nil {
			return err
		}
		rep.Markdown(w)
	default:
		return compare(ctx, env, w, conc, onlyRe)
	}
	return nil
}

// compare measures the contenders (those onlyRe matches, when set) at the
// concurrencies conc, and writes the report to w.
func compare(ctx context.Context, env *bench.Env, w io.Writer, conc []int, onlyRe *regexp.Regexp) error {
	cfg := bench.Config{
		Env: env, Workloads: strings.Split(*workloads, ","), Concurrency: conc,
		Rounds: *rounds, Duration: *duration, Warmup: *warmup,
		NumKeys: *numKeys, HotRate: *hotRate, Seed: *seed, Log: os.Stderr,
	}
	cs := bench.Contenders()
	if *more {
		cs = append(cs, bench.More()...)
	}
	if *autopipe {
		if err := env.EnableAutoPipeline(); err != nil {
			return err
		}
		cs = bench.AutoPipelineContenders()
		rep, err := bench.CheckNoScript(ctx, env)
		if err != nil {
			return err
		}
		rep.Markdown(w)
	}
	for _, dir := range splitList(*variants) {
		for _, c := range cs {
			if c.Scripted && !strings.Contains(c.Name, "[") {
				cs = append(cs, bench.Variant(c, dir))
			}
		}
	}
	if onlyRe != nil {
		var keep []bench.Contender
		for _, c := range cs {
			if c.Name == "INCR" || onlyRe.MatchString(c.Name) {
				keep = append(keep, c)
			}
		}
		cs = keep
	}
	cfg.Contenders = cs
	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return err
	}
	rep.Markdown(w)
	return nil
}

func serverVersion(env *bench.Env) string {
	info, err := env.Admin.Info(context.Background(), "server").Result()
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "?"
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func parseInts(s string) ([]int, error) {
	var levels []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad concurrency %q", f)
		}
		levels = append(levels, n)
	}
	return levels, nil
}
