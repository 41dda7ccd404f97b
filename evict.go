package redlimit

import (
	"bufio"
	"context"
	"errors"
	"log"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultEvictEvery is WithEvictionCheck's default interval.
const defaultEvictEvery = 10 * time.Second

// evictQuiet is how long a server that was reported must go without a
// rise, and be seen not rising, before a new rise is reported again.
const evictQuiet = 10 * time.Minute

// evictSampleTimeout bounds one sample of every master.
const evictSampleTimeout = time.Second

// The states of an evictWatch.
const (
	evictIdle  int32 = iota // no decision yet: the first arms the timer
	evictArmed              // the timer runs, or a sample does
	evictDue                // the interval has passed: a decision samples
)

// evictWatches holds the watch of each client and interval, shared by
// the limiters built on them.
var evictWatches struct {
	sync.Mutex
	m map[evictWatchKey]*evictWatch
}

type evictWatchKey struct {
	rdb   redis.UniversalClient
	every time.Duration
}

// evictWatch samples a client's Redis masters for evictions, for the
// limiters that share it.
type evictWatch struct {
	key   evictWatchKey
	state atomic.Int32 // evictIdle, evictArmed or evictDue: all a decision reads

	ctx    context.Context // cancelled when the last limiter closes: ends a sample in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup // the sample in flight (the tests wait for it)

	mu     sync.Mutex
	subs   map[*engine]struct{} // the limiters to report to
	closed bool
	timer  *time.Timer
	nodes  map[string]*evictNode
	logf   func(format string, v ...any) // log.Printf; tests replace it
}

// evictNode is what the watch knows of one master.
type evictNode struct {
	evicted int64     // evicted_keys at the last sample
	spell   bool      // reported, and not yet seen quiet for evictQuiet
	rose    time.Time // the last sample that saw a rise
	refused bool      // the server refused INFO: not sampled again
}

// joinEvictWatch returns the watch of e's client and interval, with e
// among the limiters it reports to; nil when every is 0 (a nil watch's
// methods do nothing). A new watch reads its baseline at once, in the
// background (see baseline).
func joinEvictWatch(e *engine, every time.Duration) *evictWatch {
	if every <= 0 {
		return nil
	}
	k := evictWatchKey{rdb: e.rdb, every: every}
	shared := reflect.TypeOf(e.rdb).Comparable() // a map key; a client of another kind gets a watch of its own
	evictWatches.Lock()
	defer evictWatches.Unlock()
	var w *evictWatch
	if shared {
		w = evictWatches.m[k]
	}
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &evictWatch{key: k, ctx: ctx, cancel: cancel, subs: make(map[*engine]struct{}),
			nodes: make(map[string]*evictNode), logf: log.Printf}
		if shared {
			if evictWatches.m == nil {
				evictWatches.m = make(map[evictWatchKey]*evictWatch)
			}
			evictWatches.m[k] = w
		}
		w.wg.Add(1)
		go w.baseline()
	}
	w.mu.Lock()
	w.subs[e] = struct{}{}
	w.mu.Unlock()
	return w
}

// baseline takes a new watch's first sample, when its first limiter
// starts: the evicted_keys of each master that later samples are compared
// with, so that what a server evicts from the start is reported (taken at
// the first sample instead, one interval after the first decision, it
// would hide what the server evicted until then). It reports nothing, and
// leaves the timer to the first decision.
func (w *evictWatch) baseline() {
	defer w.wg.Done()
	w.sample()
}

// poke starts a sample if one is due, or arms the first. Decisions that
// Redis answered call it: one atomic load, unless a sample is due.
func (w *evictWatch) poke() {
	if w == nil {
		return
	}
	switch w.state.Load() {
	case evictArmed:
		return
	case evictIdle:
		if w.state.CompareAndSwap(evictIdle, evictArmed) {
			w.mu.Lock()
			w.armLocked()
			w.mu.Unlock()
		}
		return
	}
	if !w.state.CompareAndSwap(evictDue, evictArmed) {
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
func (w *evictWatch) armLocked() {
	if !w.closed {
		w.timer = time.AfterFunc(w.key.every, func() { w.state.Store(evictDue) })
	}
}

// run takes one sample, arms the timer for the next, and then, no longer
// counted in wg (a hook may call Close), reports what it found to every
// limiter sharing the watch.
func (w *evictWatch) run() {
	found := w.sample()
	w.mu.Lock()
	w.armLocked()
	subs := make([]*engine, 0, len(w.subs))
	for e := range w.subs {
		subs = append(subs, e)
	}
	w.mu.Unlock()
	w.wg.Done()
	for _, si := range found {
		w.logf("redlimit: Redis %s evicted %d keys since the last sample (maxmemory %d, maxmemory-policy %s): limiter keys it evicts come back with a full allowance",
			serverName(si.addr), si.rise, si.maxmem, si.policy)
		for _, e := range subs {
			e.rescue.notify(transition(e, si))
		}
	}
}

// leave takes e off the limiters w reports to; the last one to leave
// ends the watch, without waiting for a sample in flight (bounded by
// evictSampleTimeout, its results dropped), so that Close does not wait
// on a Redis that hangs.
func (w *evictWatch) leave(e *engine) {
	if w == nil {
		return
	}
	evictWatches.Lock()
	defer evictWatches.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.subs, e)
	if len(w.subs) > 0 || w.closed {
		return
	}
	w.closed = true
	w.cancel()
	if w.timer != nil {
		w.timer.Stop()
	}
	if reflect.TypeOf(w.key.rdb).Comparable() && evictWatches.m[w.key] == w {
		delete(evictWatches.m, w.key)
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
func (w *evictWatch) sample() []serverInfo {
	ctx, cancel := context.WithTimeout(w.ctx, evictSampleTimeout)
	defer cancel()
	var (
		mu    sync.Mutex
		infos []serverInfo
	)
	_ = forEachMaster(ctx, w.key.rdb, func(ctx context.Context, c redis.Cmdable, addr string) {
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
func (w *evictWatch) compare(infos []serverInfo, now time.Time) []serverInfo {
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
				n = &evictNode{}
				w.nodes[si.addr] = n
			}
			n.refused = true
			continue
		}
		if si.err != nil || !si.complete {
			continue // try again at the next sample
		}
		if n == nil {
			w.nodes[si.addr] = &evictNode{evicted: si.evicted} // the baseline
			continue
		}
		rise := si.evicted - n.evicted
		n.evicted = si.evicted // a restart's lower count is the new baseline
		switch {
		case rise > 0 && evicts(si.maxmem, si.policy):
			if !n.spell {
				n.spell = true
				si.rise = rise
				found = append(found, si)
			}
			n.rose = now
		case rise <= 0 && n.spell && now.Sub(n.rose) >= evictQuiet:
			n.spell = false
		}
	}
	return found
}

// serverName names the master at addr in a report.
func serverName(addr string) string {
	if addr == "" {
		return "(the client's server)"
	}
	return addr
}

// transition is the report to e of the rise on the master si.
func transition(e *engine, si serverInfo) Transition {
	err := errorf("%s: Redis %s evicted %d keys since the last sample (maxmemory %d, maxmemory-policy %s): limiter keys it evicts come back with a full allowance: %w",
		e.kind, serverName(si.addr), si.rise, si.maxmem, si.policy, ErrEvictionPolicy)
	return Transition{Kind: TransitionEvicted, Strategy: e.rescue.strategy(), Node: si.addr, Err: err, Evicted: si.rise}
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
			si = serverInfo{addr: addr, err: errorf("INFO panicked: %v", p), refused: true}
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
	if !evicts(si.maxmem, si.policy) {
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

// notify reports t through the OnTransition hook, after the switches
// queued before it, unless the limiter is closed.
func (r *rescue) notify(t Transition) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.queue = append(r.queue, t)
	r.mu.Unlock()
	r.flush()
}
