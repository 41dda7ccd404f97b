// Command prefetch measures redlimit's local prefetches (WithPrefetch) against one
// round trip per decision, on a redis-server it starts on a free loopback
// port and stops when done.
//
//	go run ./cmd/prefetch [-rounds 3] [-duration 2s] [-size 1000] [-max-age 100ms] [-out prefetch.md]
//
// It runs, in interleaved rounds:
//   - a hot key offered -hot-rate calls per second (paced), and in a closed
//     loop of -conc goroutines, with and without prefetches: decisions per
//     second and Redis calls per decision;
//   - 4 instances (limiters with their own clients) on one key below a high
//     limit, -hot-rate in all: Redis calls per decision and the capacity the
//     prefetches hold idle;
//   - 4 instances on one key at 4× its limit: what they admit against
//     Burst + Rate·d.
//
// Redis calls are every command the clients send, counted by a go-redis
// hook. The table shows medians; compare ratios within one run, not
// figures across machines.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redlimit/redlimit/bench"
	"github.com/redlimit/redlimit/internal/redistest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "prefetch:", err)
		os.Exit(1)
	}
}

func run() error {
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	duration := flag.Duration("duration", 2*time.Second, "length of one run")
	size := flag.Int("size", 1000, "WithPrefetch size")
	maxAge := flag.Duration("max-age", 100*time.Millisecond, "WithPrefetch maxAge")
	hotRate := flag.Float64("hot-rate", 50_000, "calls per second offered to the hot key")
	conc := flag.Int("conc", 64, "goroutines of the closed-loop runs")
	out := flag.String("out", "", "also write the report to this file")
	flag.Parse()

	s, err := redistest.StartServer()
	if err != nil {
		return err
	}
	defer func() { _ = s.Close() }() // killed if it ignores SIGTERM: the report is made
	opts := redistest.TunedOptions(s.Addr)
	opts.PoolSize = 64 // the closed loop's goroutines each hold a connection without prefetches
	rep, err := bench.RunPrefetch(context.Background(), bench.PrefetchConfig{
		Addr:       s.Addr,
		ClientOpts: opts,
		Size:       *size,
		MaxAge:     *maxAge,
		Rounds:     *rounds,
		Duration:   *duration,
		HotRate:    *hotRate,
		Conc:       *conc,
		Log:        os.Stderr,
	})
	if err != nil {
		return err
	}
	var sb strings.Builder
	rep.Markdown(&sb)
	fmt.Print(sb.String())
	if *out != "" {
		return os.WriteFile(*out, []byte(sb.String()), 0o644)
	}
	return nil
}
