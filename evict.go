package redlimit

import (
	"bufio"
	"context"
	"errors"
	"log"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// WithEvictionCheck sets how often, at most, a limiter in use samples
// INFO on its Redis masters (as [CheckRedis] finds them) to notice that
// they evict keys: evicted_keys rising between two samples of a server
// whose maxmemory-policy can evict. The first rise is reported once, as a
// [Transition] with Evicted set (to the hook of [WithOnTransition]) and as
// one line of the standard library's log package (go-redis does not
// export its own logger); a server is reported again only after a sample
// found it not evicting and at least 10 minutes passed since its last
// rise. evicted_keys counts every key the server evicted, not only the
// limiter's: it is the evidence that the server deletes keys when full,
// which on an allkeys-* policy may be limiter keys, and on a volatile-*
// policy are most likely them (every limiter key has a TTL).
//
// Sampling is lazy: a decision that Redis answered, after the interval has
// passed since the last sample, starts one sample in the background (one
// goroutine, bounded by a second, ended by Close); a decision costs one
// atomic load, and an idle limiter runs nothing. A server that refuses
// INFO is not sampled again. The default is 10s; 0 turns sampling off.
func WithEvictionCheck(every time.Duration) Option {
	return optionFunc(func(c *config) { c.evictEvery = every })
}

// defaultEvictEvery is WithEvictionCheck's default interval.
const defaultEvictEvery = 10 * time.Second

// evictQuiet is how long a server that was reported must go without a
// rise, and be seen not rising, before a new rise is reported again.
const evictQuiet = 10 * time.Minute

// evictSampleTimeout bounds one sample of every master.
const evictSampleTimeout = time.Second

// evictWatch samples the limiter's Redis masters for evictions.
type evictWatch struct {
	e     *engine
	every time.Duration
	// due is set when a sample may start: by the timer armed at the end
	// of the last sample. It is all a decision reads.
	due atomic.Bool

	ctx    context.Context // cancelled by close: ends a sample in flight
	cancel context.CancelFunc
	wg     sync.WaitGroup // the sample in flight

	mu     sync.Mutex
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

// newEvictWatch returns the watch of e, which samples at most every
// interval; every 0 turns it off (due is never set).
func newEvictWatch(e *engine, every time.Duration) *evictWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &evictWatch{e: e, every: every, ctx: ctx, cancel: cancel, nodes: make(map[string]*evictNode), logf: log.Printf}
	w.due.Store(every > 0) // the first decision takes the first sample
	return w
}

// poke starts a sample if one is due. Decisions that Redis answered call
// it: one atomic load, unless a sample is due.
func (w *evictWatch) poke() {
	if !w.due.Load() || !w.due.CompareAndSwap(true, false) {
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

// run takes one sample, arms the timer for the next, and then, no longer
// counted in wg (a hook may call Close), reports what it found.
func (w *evictWatch) run() {
	found := w.sample()
	w.mu.Lock()
	if !w.closed {
		w.timer = time.AfterFunc(w.every, func() { w.due.Store(true) })
	}
	w.mu.Unlock()
	w.wg.Done()
	for _, t := range found {
		w.logf("%v", t.Err)
		w.e.rescue.notify(t)
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
	complete bool // evicted_keys was there
}

// sample reads INFO on every master not known to refuse it, and returns
// the rises to report.
func (w *evictWatch) sample() []Transition {
	ctx, cancel := context.WithTimeout(w.ctx, evictSampleTimeout)
	defer cancel()
	var (
		mu    sync.Mutex
		infos []serverInfo
	)
	_ = forEachMaster(ctx, w.e.rdb, func(ctx context.Context, c redis.Cmdable, addr string) {
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
	now := time.Now()
	var found []Transition
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
				found = append(found, w.transition(si, rise))
			}
			n.rose = now
		case rise <= 0 && n.spell && now.Sub(n.rose) >= evictQuiet:
			n.spell = false
		}
	}
	return found
}

// transition is the report of a rise on the master si.
func (w *evictWatch) transition(si serverInfo, rise int64) Transition {
	name := si.addr
	if name == "" {
		name = "(the client's server)"
	}
	err := errorf("%s: Redis %s evicted %d keys since the last sample (maxmemory %d, maxmemory-policy %s): limiter keys it evicts come back with a full allowance: %w",
		w.e.kind, name, rise, si.maxmem, si.policy, ErrEvictionPolicy)
	return Transition{Strategy: w.e.rescue.strategy(), Node: si.addr, Err: err, Evicted: rise}
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

// close stops the timer and waits for a sample in flight.
func (w *evictWatch) close() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		w.cancel()
		if w.timer != nil {
			w.timer.Stop()
		}
	}
	w.mu.Unlock()
	w.wg.Wait()
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
