// Package evictwatch samples the Redis masters behind a client for evicted
// keys, and tells the limiters that share the client when a server begins
// to evict (a limiter key evicted comes back with a full allowance). A
// watch is shared by the limiters of one client and interval; decisions
// Poke it, and a sample is taken at most once an interval, only while
// decisions are made.
package evictwatch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Report is a server that began to evict keys: the master at Addr ("": the
// client's only server, address unknown) evicted Rise keys since the
// previous sample, under its maxmemory and maxmemory-policy.
type Report struct {
	Addr      string
	Rise      int64
	MaxMemory int64
	Policy    string
}

// String describes the report, as the log line and a limiter's error say it.
func (r Report) String() string {
	return fmt.Sprintf("Redis %s evicted %d keys since the last sample (maxmemory %d, maxmemory-policy %s)",
		ServerName(r.Addr), r.Rise, r.MaxMemory, r.Policy)
}

// ServerName names the master at addr in a report.
func ServerName(addr string) string {
	if addr == "" {
		return "(the client's server)"
	}
	return addr
}

// Evicts tells whether a server with maxmemory bytes and this
// maxmemory-policy may evict keys.
func Evicts(bytes int64, policy string) bool {
	return bytes > 0 && policy != "noeviction"
}

// ForEachMaster calls f for every master behind rdb, with its address:
// concurrently for each master of a cluster and each live shard of a
// ring; once for a *redis.Client with its Addr; once with rdb and "" for
// any other client. It returns an error when the masters cannot be listed.
func ForEachMaster(ctx context.Context, rdb redis.UniversalClient, f func(ctx context.Context, c redis.Cmdable, addr string)) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			f(ctx, m, m.Options().Addr)
			return nil
		})
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, s *redis.Client) error {
			f(ctx, s, s.Options().Addr)
			return nil
		})
	case *redis.Client:
		f(ctx, c, c.Options().Addr)
		return nil
	}
	f(ctx, rdb, "")
	return nil
}

// Quiet is how long a server that was reported must go without a
// rise, and be seen not rising, before a new rise is reported again.
const Quiet = 10 * time.Minute

// SampleTimeout bounds one sample of every master.
const SampleTimeout = time.Second

// The states of an evictWatch.
const (
	idle  int32 = iota // no decision yet: the first arms the timer
	armed              // the timer runs, or a sample does
	due                // the interval has passed: a decision samples
)

// watches holds the watch of each client and interval, shared by
// the limiters built on them.
var watches struct {
	sync.Mutex
	m map[watchKey]*Watch
}

type watchKey struct {
	rdb   redis.UniversalClient
	every time.Duration
}

// Watch samples a client's Redis masters for evictions, for the
// limiters that share it.
type Watch struct {
	key   watchKey
	state atomic.Int32 // idle, armed or due: all a decision reads

	ctx    context.Context // cancelled when the last limiter closes: ends a sample in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup // the sample in flight (the tests wait for it)

	mu     sync.Mutex
	subs   map[any]func(Report) // the limiters to report to, by their id
	closed bool
	timer  *time.Timer
	nodes  map[string]*node
	logf   func(format string, v ...any) // log.Printf; tests replace it
}

// node is what the watch knows of one master.
type node struct {
	evicted int64     // evicted_keys at the last sample
	spell   bool      // reported, and not yet seen quiet for Quiet
	rose    time.Time // the last sample that saw a rise
	refused bool      // the server refused INFO: not sampled again
}

// Join returns the watch of rdb and the interval every, with f among the
// reports it makes, under id (a limiter: Leave takes it off); nil when
// every is 0 (a nil watch's methods do nothing). A new watch reads its
// baseline at once, in the background (see baseline).
func Join(rdb redis.UniversalClient, every time.Duration, id any, f func(Report)) *Watch {
	if every <= 0 {
		return nil
	}
	k := watchKey{rdb: rdb, every: every}
	shared := reflect.TypeOf(rdb).Comparable() // a map key; a client of another kind gets a watch of its own
	watches.Lock()
	defer watches.Unlock()
	var w *Watch
	if shared {
		w = watches.m[k]
	}
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &Watch{key: k, ctx: ctx, cancel: cancel, subs: make(map[any]func(Report)),
			nodes: make(map[string]*node), logf: log.Printf}
		if shared {
			if watches.m == nil {
				watches.m = make(map[watchKey]*Watch)
			}
			watches.m[k] = w
		}
		w.wg.Add(1)
		go w.baseline()
	}
	w.mu.Lock()
	w.subs[id] = f
	w.mu.Unlock()
	return w
}

// baseline takes a new watch's first sample, when its first limiter
// starts: the evicted_keys of each master that later samples are compared
// with, so that what a server evicts from the start is reported (taken at
// the first sample instead, one interval after the first decision, it
// would hide what the server evicted until then). It reports nothing, and
// leaves the timer to the first decision.
func (w *Watch) baseline() {
	defer w.wg.Done()
	w.sample()
}

// Poke starts a sample if one is due, or arms the first. Decisions that
// Redis answered call it: one atomic load, unless a sample is due.
func (w *Watch) Poke() {
	if w == nil {
		return
	}
	switch w.state.Load() {
	case armed:
		return
	case idle:
		if w.state.CompareAndSwap(idle, armed) {
			w.mu.Lock()
			w.armLocked()
			w.mu.Unlock()
		}
		return
	}
	if !w.state.CompareAndSwap(due, armed) {
		return
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.wg.Add(1)
	w.mu.Unlock()
	go w.run()
}

// armLocked makes a sample due after the interval. w.mu is held.
func (w *Watch) armLocked() {
	if !w.closed {
		w.timer = time.AfterFunc(w.key.every, func() { w.state.Store(due) })
	}
}

// run takes one sample, arms the timer for the next, and then, no longer
// counted in wg (a hook may call Close), reports what it found to every
// limiter sharing the watch.
func (w *Watch) run() {
	found := w.sample()
	w.mu.Lock()
	w.armLocked()
	subs := make([]func(Report), 0, len(w.subs))
	for _, f := range w.subs {
		subs = append(subs, f)
	}
	logf := w.logf
	w.mu.Unlock()
	w.wg.Done()
	for _, si := range found {
		rep := Report{Addr: si.addr, Rise: si.rise, MaxMemory: si.maxmem, Policy: si.policy}
		logf("redlimit: %s: limiter keys it evicts come back with a full allowance", rep)
		for _, f := range subs {
			f(rep)
		}
	}
}

// Leave takes the limiter id off those w reports to; the last one to leave
// ends the watch, without waiting for a sample in flight (bounded by
// SampleTimeout, its results dropped), so that Close does not wait
// on a Redis that hangs.
func (w *Watch) Leave(id any) {
	if w == nil {
		return
	}
	watches.Lock()
	defer watches.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.subs, id)
	if len(w.subs) > 0 || w.closed {
		return
	}
	w.closed = true
	w.cancel()
	if w.timer != nil {
		w.timer.Stop()
	}
	if reflect.TypeOf(w.key.rdb).Comparable() && watches.m[w.key] == w {
		delete(watches.m, w.key)
	}
}

// serverInfo is what a sample reads from one master's INFO.
type serverInfo struct {
	addr     string
	evicted  int64
	maxmem   int64
	policy   string
	err      error
	refused  bool
	complete bool  // evicted_keys was there
	rise     int64 // keys evicted since the previous sample
}

// sample reads INFO on every master not known to refuse it, and returns
// the rises to report.
func (w *Watch) sample() []serverInfo {
	ctx, cancel := context.WithTimeout(w.ctx, SampleTimeout)
	defer cancel()
	var (
		mu    sync.Mutex
		infos []serverInfo
	)
	_ = ForEachMaster(ctx, w.key.rdb, func(ctx context.Context, c redis.Cmdable, addr string) {
		w.mu.Lock()
		n := w.nodes[addr]
		w.mu.Unlock()
		if n != nil && n.refused {
			return
		}
		si := readInfo(ctx, c, addr)
		mu.Lock()
		infos = append(infos, si)
		mu.Unlock()
	})
	return w.compare(infos, time.Now())
}

// compare updates each node's count of evicted keys from infos, read at
// now, and returns the infos of the nodes whose evictions began a spell.
func (w *Watch) compare(infos []serverInfo, now time.Time) []serverInfo {
	var found []serverInfo
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	for _, si := range infos {
		n := w.nodes[si.addr]
		if si.refused {
			if n == nil {
				n = &node{}
				w.nodes[si.addr] = n
			}
			n.refused = true
			continue
		}
		if si.err != nil || !si.complete {
			continue // try again at the next sample
		}
		if n == nil {
			w.nodes[si.addr] = &node{evicted: si.evicted} // the baseline
			continue
		}
		rise := si.evicted - n.evicted
		n.evicted = si.evicted // a restart's lower count is the new baseline
		switch {
		case rise > 0 && Evicts(si.maxmem, si.policy):
			if !n.spell {
				n.spell = true
				si.rise = rise
				found = append(found, si)
			}
			n.rose = now
		case rise <= 0 && n.spell && now.Sub(n.rose) >= Quiet:
			n.spell = false
		}
	}
	return found
}

// readInfo reads maxmemory and maxmemory_policy from INFO memory of the
// master c at addr and, where they let the server evict, evicted_keys from
// INFO stats (one section a call: Redis before 7.0 takes one). A server
// that answers INFO memory with an error reply refuses it (a managed
// service, or miniredis, which knows neither section and must not be sent
// INFO stats: its INFO reads its server unlocked, and crashes the program
// when that server is being closed). A client that panics on INFO (a fake
// that implements only what decisions use) refuses it too: the sample runs
// on a goroutine of its own, where a panic would end the program.
func readInfo(ctx context.Context, c redis.Cmdable, addr string) (si serverInfo) {
	si.addr = addr
	defer func() {
		if p := recover(); p != nil {
			si = serverInfo{addr: addr, err: fmt.Errorf("INFO panicked: %v", p), refused: true}
		}
	}()
	text, err := c.Info(ctx, "memory").Result()
	if err != nil {
		var reply redis.Error
		si.err, si.refused = err, errors.As(err, &reply)
		return si
	}
	infoFields(text, func(name, value string) {
		switch name {
		case "maxmemory":
			si.maxmem, _ = strconv.ParseInt(value, 10, 64)
		case "maxmemory_policy":
			si.policy = value
		}
	})
	if !Evicts(si.maxmem, si.policy) {
		return si // not complete: no baseline until it may evict
	}
	if text, err = c.Info(ctx, "stats").Result(); err != nil {
		si.err = err
		return si
	}
	infoFields(text, func(name, value string) {
		if name == "evicted_keys" {
			if v, err := strconv.ParseInt(value, 10, 64); err == nil {
				si.evicted, si.complete = v, true
			}
		}
	})
	return si
}

// infoFields calls f with each "name:value" line of an INFO reply.
func infoFields(text string, f func(name, value string)) {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if name, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			f(name, value)
		}
	}
}

// What the tests of the limiters read and drive of a watch.

// Wait waits for the sample in flight, if any.
func (w *Watch) Wait() { w.wg.Wait() }

// MakeDue makes a sample due: the next Poke takes one.
func (w *Watch) MakeDue() { w.state.Store(due) }

// Due tells whether a sample is due; Armed whether the timer (or a sample)
// runs.
func (w *Watch) Due() bool { return w.state.Load() == due }

// Armed tells whether the timer of the next sample, or a sample, runs.
func (w *Watch) Armed() bool { return w.state.Load() == armed }

// Node tells whether the watch holds a baseline of the master at addr,
// and whether that master refused INFO.
func (w *Watch) Node(addr string) (known, refused bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nodes[addr]
	return n != nil, n != nil && n.refused
}

// Closed tells whether the last limiter left w.
func (w *Watch) Closed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// SetLogf replaces the log of the reports (log.Printf).
func (w *Watch) SetLogf(f func(format string, v ...any)) {
	w.mu.Lock()
	w.logf = f
	w.mu.Unlock()
}

// Watching returns how many watches of rdb are running.
func Watching(rdb redis.UniversalClient) int {
	watches.Lock()
	defer watches.Unlock()
	n := 0
	for k := range watches.m {
		if k.rdb == rdb {
			n++
		}
	}
	return n
}
