package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
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

// errDegraded reports a decision the limiter could not ask Redis for.
var errDegraded = errors.New("decided without Redis")

// errCapture reports a region script EVALSHA that does not parse.
var errCapture = errors.New("a region script EVALSHA of an unexpected shape")

// unit is one key's part of a region script EVALSHA: its keys (the rules'
// state keys, then its peer record) and its journal (e, c, k, t, pe, pc,
// pk).
type unit struct {
	keys, journal []string
}

// capture is a go-redis hook that keeps what each region script EVALSHA a
// client sent and Redis ran carried for each key: its unit, by first state
// key, and the arguments before the journals (the head, the same for all).
type capture struct {
	mu     sync.Mutex
	sha    string
	head   []string
	byKey  map[string]unit
	failed error
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
				if e := c.split(args); e != nil {
					c.failed = e
				}
			}
		}
		return err
	}
}

// split records the units of one EVALSHA's arguments: "evalsha", sha,
// numkeys, the keys, then ARGV, whose ARGV[2] is the rules' count n and
// whose journals start after 12 + 4n arguments (scripts/region_apply.lua).
func (c *capture) split(args []string) error {
	nk, err := strconv.Atoi(args[2])
	if err != nil || len(args) < 3+nk+2 {
		return fmt.Errorf("regions: %q: %w", args[:min(len(args), 4)], errCapture)
	}
	keys, argv := args[3:3+nk], args[3+nk:]
	nrules, err := strconv.Atoi(argv[1])
	stride, h := nrules+1, 12+4*nrules
	if err != nil || nk%stride != 0 || len(argv) != h+7*(nk/stride) {
		return fmt.Errorf("regions: %d keys, %d arguments: %w", nk, len(argv), errCapture)
	}
	c.sha, c.head = args[1], argv[:h]
	for j := range nk / stride {
		c.byKey[keys[j*stride]] = unit{keys: keys[j*stride : (j+1)*stride], journal: argv[h+7*j : h+7*j+7]}
	}
	return nil
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
// journals of keys decided once each to a second redis-server and keeps
// each key's part of the EVALSHAs it sent. It reads the journals back with
// pipelined GETs, as the main loop does (at once, while they live), then
// replays the EVALSHAs on the second server, otherwise idle, rounds times
// each, in calls of batchSizes keys: as charges (the journals grown by
// one), as no-op repeats, as a silent peer's share ('a') and as an 'a'
// passed over (the peer delivered a journal of the key within the
// staleness bound). It prints each command's usec_per_call (INFO
// commandstats) and the server's CPU per call and per key (INFO cpu,
// which counts reading and replying too), and fits a call's cost as a
// fixed part and a part per key.
func measure(keys, rounds int, batchSizes []int) error {
	localSrv, local, err := startServer()
	if err != nil {
		return err
	}
	defer closeServer(localSrv, local)
	remoteSrv, remote, err := startServer()
	if err != nil {
		return err
	}
	defer closeServer(remoteSrv, remote)
	ctx := context.Background()
	for si, st := range strategies {
		if err := measureStrategy(ctx, local, remote, remoteSrv.Addr, si, st, keys, rounds, batchSizes); err != nil {
			return err
		}
	}
	return nil
}

// startServer starts a redis-server and returns it with a client of it.
func startServer() (*redistest.Server, *redis.Client, error) {
	s, err := redistest.StartServer()
	if err != nil {
		return nil, nil, err
	}
	return s, redis.NewClient(patient(s.Addr)), nil
}

// closeServer closes the client rdb, then the server s.
func closeServer(s *redistest.Server, rdb *redis.Client) {
	_ = rdb.Close()
	_ = s.Close()
}

// strategy is a strategy -measure times: its name, and how to make a
// limiter of it.
type strategy struct {
	name string
	mk   func(redis.UniversalClient, ...redlimit.Option) (*redlimit.RateLimiter, error)
}

// strategies are the strategies -measure times, in order.
var strategies = []strategy{
	{"token bucket", func(c redis.UniversalClient, o ...redlimit.Option) (*redlimit.RateLimiter, error) {
		return redlimit.NewTokenBucket(c, redlimit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}, o...)
	}},
	{"fixed window", func(c redis.UniversalClient, o ...redlimit.Option) (*redlimit.RateLimiter, error) {
		return redlimit.NewFixedWindow(c, redlimit.PerMinute(60000), o...)
	}},
}

// measureStrategy has strategy st's exchange, its si-th, deliver keys
// keys' journals from local to the server at remoteAddr (remote's), then
// times the journal GETs on local and the region script calls of each of
// batchSizes on remote, and prints what they cost (see measure).
func measureStrategy(ctx context.Context, local, remote *redis.Client, remoteAddr string, si int, st strategy, keys, rounds int, batchSizes []int) error {
	hook, err := deliverOnce(ctx, local, remoteAddr, si, keys, st.mk)
	if err != nil {
		return err
	}
	units := make([]unit, 0, keys)
	for _, u := range hook.byKey {
		units = append(units, u)
	}
	var sizes []string
	bytes := map[int]float64{}
	for _, b := range batchSizes {
		var tail []string
		for _, u := range units[:b] {
			tail = append(tail, u.journal...)
		}
		bytes[b] = float64(respSize(call(hook.sha, hook.head, units[:b], tail)))
		sizes = append(sizes, fmt.Sprintf("%d key(s) %.0f B", b, bytes[b]))
	}
	fmt.Printf("%s: %d keys; a region script EVALSHA as sent (keys of 15 characters): %s\n", st.name, len(units), strings.Join(sizes, ", "))
	if err := timeGets(ctx, local, st.name, hook.head, units, rounds); err != nil {
		return err
	}
	cpu, order, err := timePhases(ctx, remote, st.name, hook, units, batchSizes, rounds)
	if err != nil {
		return err
	}
	for _, what := range order {
		fmt.Printf("  %-50s %s\n", "fit, "+what+":", fit(cpu[what], "µs"))
	}
	fmt.Printf("  %-50s %s\n", "fit, bytes of a delivery's EVALSHA:", fit(bytes, "B"))
	return nil
}

// timeGets times the GETs of units' journals on local, pipelined, rounds
// times, and prints what they cost.
func timeGets(ctx context.Context, local *redis.Client, name string, head []string, units []unit, rounds int) error {
	// The journals, read back at once (a token bucket's live a life,
	// 2 s, after the last admission), by their key: the peer record's
	// with ":j" and the life in ms (head's last arguments but one, µs).
	life, _ := strconv.ParseInt(head[len(head)-2], 10, 64)
	gets := make([][]string, len(units))
	for i, u := range units {
		gets[i] = []string{"get", fmt.Sprintf("%s:j%d", strings.TrimSuffix(u.keys[len(u.keys)-1], peersSuffix), life/1000)}
	}
	hits, err := found(ctx, local, gets)
	if err != nil {
		return err
	}
	_, err = timed(ctx, local, "get", fmt.Sprintf("%s, journal GET (%d of %d found)", name, hits, len(gets)), 1, rounds, func(int) [][]string { return gets })
	return err
}

// grown returns a unit's journal grown by n events, at now.
func grown(u unit, n int) []string {
	j := append([]string(nil), u.journal...)
	c, _ := strconv.ParseInt(j[1], 10, 64)
	k, _ := strconv.ParseInt(j[2], 10, 64)
	j[1], j[2] = strconv.FormatInt(c+int64(n), 10), strconv.FormatInt(k+int64(n), 10)
	j[3] = strconv.FormatInt(time.Now().UnixMicro(), 10)
	return j
}

// phase is a kind of region script call -measure times: what it is, and
// how to make one for some units.
type phase struct {
	what string
	mk   func(us []unit) []string
}

// phases are the kinds of region script call of hook's EVALSHAs: a
// delivery that charges (the journals grown by *grew), its no-op repeat,
// a silent peer's share charged and one passed over.
func phases(hook *capture, grew *int) []phase {
	head := hook.head
	peer, mode, bound := len(head)-5, len(head)-4, len(head)-1
	delivery := func(us []unit) []string {
		var tail []string
		for _, u := range us {
			tail = append(tail, grown(u, *grew)...)
		}
		return call(hook.sha, head, us, tail)
	}
	return []phase{
		{"charge", delivery},
		{"no-op repeat", delivery},
		{"share 'a', charged", func(us []unit) []string {
			h := append([]string(nil), head...)
			h[peer], h[mode] = "ap", "a" // a peer never heard here
			return call(hook.sha, h, us, []string{strconv.FormatInt(time.Now().Add(-time.Second).UnixMicro(), 10)})
		}},
		{"share 'a', skipped", func(us []unit) []string {
			h := append([]string(nil), head...)
			h[mode], h[bound] = "a", "3600000000" // "eu" delivered within the bound
			return call(hook.sha, h, us, []string{strconv.FormatInt(time.Now().Add(-time.Second).UnixMicro(), 10)})
		}},
	}
}

// timePhases times each phase's region script calls on remote, in calls
// of each of batchSizes units, rounds times, and returns the server's CPU
// per call by phase and by batch size, and the phases in order.
func timePhases(ctx context.Context, remote *redis.Client, name string, hook *capture, units []unit, batchSizes []int, rounds int) (map[string]map[int]float64, []string, error) {
	grew := 0                           // how far the journals have grown on the peer
	cpu := map[string]map[int]float64{} // by phase, by batch size: µs per call
	var order []string
	for _, b := range batchSizes {
		for _, ph := range phases(hook, &grew) {
			if cpu[ph.what] == nil {
				cpu[ph.what] = map[int]float64{}
				order = append(order, ph.what)
			}
			var err error
			cpu[ph.what][b], err = timed(ctx, remote, "evalsha", fmt.Sprintf("%s, %s, %d key(s) a call", name, ph.what, b), b, rounds, func(int) [][]string {
				if ph.what == "charge" {
					grew++ // each round's charge grows them by one more
				}
				return inBatches(units, b, ph.mk)
			})
			if err != nil {
				return nil, nil, err
			}
		}
	}
	return cpu, order, nil
}

// inBatches makes a call of mk for each batch of b of units, in order.
func inBatches(units []unit, b int, mk func([]unit) []string) [][]string {
	var out [][]string
	for lo := 0; lo < len(units); lo += b {
		out = append(out, mk(units[lo:min(lo+b, len(units))]))
	}
	return out
}

// fit fits y = a + b·keys through by's smallest and largest batch sizes
// and says how far each other size lies from it.
func fit(by map[int]float64, unit string) string {
	lo, hi := math.MaxInt, 0
	for b := range by {
		lo, hi = min(lo, b), max(hi, b)
	}
	if lo == hi {
		return fmt.Sprintf("%.2f %s at %d key(s)", by[lo], unit, lo)
	}
	per := (by[hi] - by[lo]) / float64(hi-lo)
	fixed := by[lo] - per*float64(lo)
	out := fmt.Sprintf("%.2f %s a call + %.2f %s a key", fixed, unit, per, unit)
	for _, b := range slices.Sorted(maps.Keys(by)) {
		if b != lo && b != hi {
			out += fmt.Sprintf(" (at %d keys: %.1f, measured %.1f)", b, fixed+per*float64(b), by[b])
		}
	}
	return out
}

// deliverOnce builds a limiter with mk on local, region "us" with the
// peer "eu" at peerAddr, decides keys keys once each (their names tagged
// with si) and returns, once the exchange has delivered them all, the
// EVALSHAs it sent, by key.
func deliverOnce(ctx context.Context, local *redis.Client, peerAddr string, si, keys int, mk func(redis.UniversalClient, ...redlimit.Option) (*redlimit.RateLimiter, error)) (*capture, error) {
	peer := redis.NewClient(patient(peerAddr))
	defer func() { _ = peer.Close() }()
	hook := &capture{byKey: map[string]unit{}}
	peer.AddHook(hook)
	lim, err := mk(local, redlimit.WithRegions(redlimit.Regions{Name: "us", Peers: map[string]redis.UniversalClient{"eu": peer}}))
	if err != nil {
		return nil, err
	}
	defer func() { _ = lim.Close() }()
	var wg sync.WaitGroup
	var failed error
	var fmu sync.Mutex
	for w := range 32 {
		wg.Go(func() {
			for k := w; k < keys; k += 32 {
				res, err := lim.Allow(ctx, fmt.Sprintf("s%d:user:%07d", si, k))
				if err == nil && res.Degraded {
					err = fmt.Errorf("regions: key %d: %w", k, errDegraded)
				}
				if err != nil {
					fmu.Lock()
					failed = err
					fmu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if failed != nil {
		return nil, failed
	}
	for deadline := time.Now().Add(30 * time.Second); hook.len() < keys && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if hook.failed != nil {
		return nil, hook.failed
	}
	if len(hook.byKey) < keys {
		return nil, fmt.Errorf("regions: %d of %d keys delivered: %w", len(hook.byKey), keys, errUndelivered)
	}
	return hook, nil
}

// patient returns the options of a client of addr that waits out a busy
// machine (a decision that timed out would be answered by the fallback,
// and its key never journaled).
func patient(addr string) *redis.Options {
	o := redistest.TunedOptions(addr)
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = 5*time.Second, 5*time.Second, 5*time.Second, 5*time.Second
	return o
}

// peersSuffix ends a key's peer record (regions.go).
const peersSuffix = ":p"

// found returns how many of the GETs gets find a value on rdb.
func found(ctx context.Context, rdb *redis.Client, gets [][]string) (int, error) {
	cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, g := range gets {
			p.Get(ctx, g[1])
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	n := 0
	for _, c := range cmds {
		if c.Err() == nil {
			n++
		}
	}
	return n, nil
}

// call returns the arguments of a region script EVALSHA of units, with
// head's arguments and then tail.
func call(sha string, head []string, units []unit, tail []string) []string {
	var keys []string
	for _, u := range units {
		keys = append(keys, u.keys...)
	}
	out := append([]string{"evalsha", sha, strconv.Itoa(len(keys))}, keys...)
	return append(append(out, head...), tail...)
}

// pipeKeys is about how many keys one pipeline of -measure carries: an
// instance's interval's worth in the 10-region case.
const pipeKeys = 2048

// timed runs rounds of the commands mk returns on rdb, each of perCall
// keys, in pipelines of about pipeKeys keys, prints what Redis spent on
// cmd (name as in commandstats), per call and per key, and returns the
// server's CPU per call (µs).
func timed(ctx context.Context, rdb *redis.Client, cmd, what string, perCall, rounds int, mk func(round int) [][]string) (float64, error) {
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return 0, err
	}
	cpu0, err := usedCPU(ctx, rdb)
	if err != nil {
		return 0, err
	}
	n, per := 0, max(1, pipeKeys/perCall)
	for r := range rounds {
		all := mk(r)
		for lo := 0; lo < len(all); lo += per {
			cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, a := range all[lo:min(lo+per, len(all))] {
					args := make([]any, len(a))
					for i := range a {
						args[i] = a[i]
					}
					p.Do(ctx, args...)
				}
				return nil
			})
			if err != nil && !errors.Is(err, redis.Nil) {
				return 0, fmt.Errorf("regions: %s: %w", what, err)
			}
			n += len(cmds)
		}
	}
	cpu1, err := usedCPU(ctx, rdb)
	if err != nil {
		return 0, err
	}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	perCallUs := "?"
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":"); ok {
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
					perCallUs = v
				}
			}
		}
	}
	cpu := (cpu1 - cpu0) * 1e6 / float64(n)
	fmt.Printf("  %-50s %7d calls: usec_per_call %8s, server CPU %8.2f µs per call, %6.2f per key\n", what, n, perCallUs, cpu, cpu/float64(perCall))
	return cpu, nil
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
