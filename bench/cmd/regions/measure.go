package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

// errUndelivered reports that the exchange did not deliver every key.
var errUndelivered = errors.New("the exchange did not deliver every key in 30 s")

// capture is a go-redis hook that keeps, by first key, the arguments of
// each region script EVALSHA a client sent and Redis ran.
type capture struct {
	mu    sync.Mutex
	byKey map[string][]string
}

func (c *capture) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (c *capture) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (c *capture) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, cmd := range cmds {
			if cmd.Name() == "evalsha" && cmd.Err() == nil {
				args := make([]string, len(cmd.Args()))
				for i, a := range cmd.Args() {
					args[i] = fmt.Sprint(a)
				}
				c.byKey[args[3]] = args
			}
		}
		return err
	}
}

func (c *capture) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byKey)
}

// respSize is the size of args sent as a RESP array of bulk strings.
func respSize(args []string) int {
	n := len(fmt.Sprintf("*%d\r\n", len(args)))
	for _, a := range args {
		n += len(fmt.Sprintf("$%d\r\n", len(a))) + len(a) + 2
	}
	return n
}

// measure has a limiter's exchange (region "us", peer "eu") deliver the
// journals of keys decided once each to a second redis-server, keeps the
// EVALSHAs it sent, and replays them, rounds times each, on an otherwise
// idle server: as charges (the journals grown by one), as no-op repeats,
// as a silent peer's share ('a'); and reads the journals back with
// pipelined GETs, as the peer loops do. It prints each command's
// usec_per_call (INFO commandstats) and the server's CPU per command
// (INFO cpu, which counts reading and replying too).
func measure(keys, rounds int) error {
	var srv [2]*redistest.Server
	var rdb [2]*redis.Client
	for i := range srv {
		s, err := redistest.StartServer()
		if err != nil {
			return err
		}
		defer func() { _ = s.Close() }()
		o := redistest.TunedOptions(s.Addr)
		o.ReadTimeout, o.WriteTimeout = 5*time.Second, 5*time.Second
		srv[i], rdb[i] = s, redis.NewClient(o)
		defer func() { _ = rdb[i].Close() }()
	}
	local, remote := rdb[0], rdb[1]
	strategies := []struct {
		name string
		mk   func(redis.UniversalClient, ...redlimit.Option) (*redlimit.RateLimiter, error)
	}{
		{"token bucket", func(c redis.UniversalClient, o ...redlimit.Option) (*redlimit.RateLimiter, error) {
			return redlimit.NewTokenBucket(c, redlimit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}, o...)
		}},
		{"fixed window", func(c redis.UniversalClient, o ...redlimit.Option) (*redlimit.RateLimiter, error) {
			return redlimit.NewFixedWindow(c, redlimit.PerMinute(60000), o...)
		}},
	}
	ctx := context.Background()
	for si, st := range strategies {
		o := redistest.TunedOptions(srv[1].Addr)
		o.ReadTimeout, o.WriteTimeout = 5*time.Second, 5*time.Second
		peer := redis.NewClient(o)
		hook := &capture{byKey: map[string][]string{}}
		peer.AddHook(hook)
		lim, err := st.mk(local, redlimit.WithRegions(redlimit.Regions{Name: "us", Peers: map[string]redis.UniversalClient{"eu": peer}}))
		if err != nil {
			return err
		}
		var wg sync.WaitGroup
		var failed error
		var fmu sync.Mutex
		for w := range 32 {
			wg.Go(func() {
				for k := w; k < keys; k += 32 {
					if _, err := lim.Allow(ctx, fmt.Sprintf("s%d:user:%07d", si, k)); err != nil {
						fmu.Lock()
						failed = err
						fmu.Unlock()
					}
				}
			})
		}
		wg.Wait()
		for deadline := time.Now().Add(30 * time.Second); hook.len() < keys && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		_ = lim.Close()
		_ = peer.Close()
		if failed != nil {
			return failed
		}
		if hook.len() < keys {
			return fmt.Errorf("regions: %d of %d keys delivered: %w", hook.len(), keys, errUndelivered)
		}
		var sample []string
		cmds := make([][]string, 0, keys)
		for _, a := range hook.byKey {
			cmds = append(cmds, a)
			sample = a
		}
		fmt.Printf("%s: region script EVALSHA of %d keys (%d bytes as sent; e.g. %q)\n", st.name, len(cmds), respSize(sample), strings.Join(sample[3:], " "))

		// The tail of a 'u': peer, "u", e, c, k, t, share, horizon.
		tail := func(a []string) int { return len(a) - 8 }
		charge := func(round int) func([]string) []string {
			return func(a []string) []string {
				b := append([]string(nil), a...)
				i := tail(b)
				c, _ := strconv.ParseInt(b[i+3], 10, 64)
				k, _ := strconv.ParseInt(b[i+4], 10, 64)
				b[i+3], b[i+4] = strconv.FormatInt(c+int64(round), 10), strconv.FormatInt(k+int64(round), 10)
				b[i+5] = strconv.FormatInt(time.Now().UnixMicro(), 10)
				return b
			}
		}
		phases := []struct {
			what string
			args func(round int) func([]string) []string
		}{
			{"charge", func(r int) func([]string) []string { return charge(r + 1) }},
			{"no-op repeat", func(int) func([]string) []string { return charge(rounds) }},
			{"silent share", func(int) func([]string) []string {
				since := strconv.FormatInt(time.Now().Add(-time.Second).UnixMicro(), 10)
				return func(a []string) []string {
					i := tail(a)
					return append(append(append([]string(nil), a[:i]...), "ap", "a", since), a[i+6:]...)
				}
			}},
		}
		for _, ph := range phases {
			if err := timed(ctx, remote, "evalsha", st.name+", "+ph.what, rounds, func(r int) [][]string {
				f := ph.args(r)
				out := make([][]string, len(cmds))
				for i, a := range cmds {
					out[i] = f(a)
				}
				return out
			}); err != nil {
				return err
			}
		}
		if err := timed(ctx, local, "get", st.name+", journal GET", rounds, func(int) [][]string {
			out := make([][]string, len(cmds))
			for i, a := range cmds {
				n, _ := strconv.Atoi(a[2])
				out[i] = []string{"get", strings.TrimSuffix(a[2+n], ":p") + ":j"}
			}
			return out
		}); err != nil {
			return err
		}
	}
	return nil
}

// timed runs rounds of the commands mk returns on rdb, in pipelines of
// 1,000, and prints what Redis spent on cmd (name as in commandstats).
func timed(ctx context.Context, rdb *redis.Client, cmd, what string, rounds int, mk func(round int) [][]string) error {
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return err
	}
	cpu0, err := usedCPU(ctx, rdb)
	if err != nil {
		return err
	}
	n := 0
	for r := range rounds {
		all := mk(r)
		for lo := 0; lo < len(all); lo += 1000 {
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, a := range all[lo:min(lo+1000, len(all))] {
					args := make([]any, len(a))
					for i := range a {
						args[i] = a[i]
					}
					p.Do(ctx, args...)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("regions: %s: %w", what, err)
			}
			n += min(1000, len(all)-lo)
		}
	}
	cpu1, err := usedCPU(ctx, rdb)
	if err != nil {
		return err
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return err
	}
	perCall := "?"
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":"); ok {
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
					perCall = v
				}
			}
		}
	}
	fmt.Printf("  %-32s %7d calls: usec_per_call %6s, server CPU %.2f µs per call\n", what, n, perCall, (cpu1-cpu0)*1e6/float64(n))
	return nil
}

// usedCPU returns the server's CPU time, user and system, in seconds.
func usedCPU(ctx context.Context, rdb *redis.Client) (float64, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			sum += f
		}
	}
	return sum, nil
}
