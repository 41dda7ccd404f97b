package redlimit

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/answers"
	"github.com/redlimit/redlimit/internal/lru"
	"github.com/redlimit/redlimit/internal/outage"
)

// FallbackPolicy says what a limiter answers while Redis is unavailable.
//
// Down-state is kept per Redis node (a cluster master, a ring shard),
// shared by the limiters on one client: a failure that concerns the whole
// node (a refused connection, LOADING, READONLY, CLUSTERDOWN, OOM, ...)
// marks it down at once; one that may concern one call (a timeout, a lost
// connection, TRYAGAIN) is answered from the fallback, and the node is
// marked down only if a probe fails too. Calls for its keys then get
// Result.Degraded set until two probes in a row, every ping interval
// ([WithPingInterval]), succeed. A denial, the caller's context ending or
// a client the program closed is never an outage. See docs/fallback.md.
type FallbackPolicy int

// The fallback policies.
const (
	// FallbackLocal answers from an in-process golang.org/x/time/rate
	// limiter per key, with the strategy's rate and burst scaled by the
	// fallback share (see [WithFallbackShare]). It is the default. A key's
	// stand-in starts from Redis's last answer about it, keeps a penalty
	// block ([WithBlock]) until it ends, and writes nothing back; see
	// docs/fallback.md for each strategy's stand-in.
	FallbackLocal FallbackPolicy = iota + 1
	// FallbackAllow allows every call (fail open).
	FallbackAllow
	// FallbackDeny denies every call (fail closed), with RetryAfter set to
	// the ping interval.
	FallbackDeny
	// FallbackError returns an error wrapping ErrUnavailable and the cause.
	FallbackError
)

// String returns the policy's name: "local", "allow", "deny" or "error".
func (p FallbackPolicy) String() string {
	switch p {
	case FallbackLocal:
		return "local"
	case FallbackAllow:
		return "allow"
	case FallbackDeny:
		return "deny"
	case FallbackError:
		return "error"
	}
	return fmt.Sprintf("FallbackPolicy(%d)", int(p))
}

// Transition tells that a limiter switched one Redis node to its fallback
// (Down) or back to Redis, or, Kind TransitionEvicted, that a server
// evicted keys. See [WithOnTransition]. Its String method says which, for
// a log line.
type Transition struct {
	// Kind says what the Transition reports: TransitionDown,
	// TransitionBack or TransitionEvicted. Switch on it rather than on
	// Down, which an eviction notice has false too.
	Kind     TransitionKind
	Strategy Strategy
	// Node is the address of the node (a cluster master or a ring shard)
	// whose keys switched, or "" when the switch concerns the whole client
	// (a *redis.Client, an AutoPipeliner, or a cluster or ring that could
	// not route the key).
	Node   string
	Down   bool          // true: the node marked unavailable; false: back on Redis, or a notice
	Err    error         // Down: the error that marked it unavailable
	Outage time.Duration // back on Redis: how long it was marked unavailable
	// Evicted, when above 0, makes this a notice, not a switch: the node
	// (its address, even for a *redis.Client) evicted that many keys
	// between two samples (see [WithEvictionCheck]); Down is false and
	// Err wraps ErrEvictionPolicy.
	Evicted int64
}

// TransitionKind is what a [Transition] reports.
type TransitionKind int

// The kinds of Transition.
const (
	// TransitionDown: a node switched to the fallback (Down is true).
	TransitionDown TransitionKind = iota + 1
	// TransitionBack: a node switched back to Redis (Outage is set).
	TransitionBack
	// TransitionEvicted: a notice, not a switch: a server evicted keys
	// (Evicted is set; see [WithEvictionCheck]).
	TransitionEvicted
)

// String returns "down", "back" or "evicted".
func (k TransitionKind) String() string {
	switch k {
	case TransitionDown:
		return "down"
	case TransitionBack:
		return "back"
	case TransitionEvicted:
		return "evicted"
	}
	return fmt.Sprintf("TransitionKind(%d)", int(k))
}

// String describes t in one line: "redlimit: Redis node 10.0.0.1:6379
// unavailable, the fallback decides: …", "… back after 1.2s unavailable",
// or an eviction notice's Err ("… evicted 5035 keys since the last
// sample …"). A Node of "" is the client's one server ("Redis").
func (t Transition) String() string {
	node := "Redis node " + t.Node
	if t.Node == "" {
		node = "Redis"
	}
	switch {
	case t.Kind == TransitionEvicted || t.Evicted > 0:
		if t.Err != nil {
			return t.Err.Error()
		}
		return fmt.Sprintf("redlimit: %s evicted %d keys", node, t.Evicted)
	case t.Down:
		return fmt.Sprintf("redlimit: %s unavailable, the fallback decides: %v", node, t.Err)
	}
	return fmt.Sprintf("redlimit: %s back after %v unavailable", node, t.Outage)
}

// rescue holds a limiter's fallback state: its share of the watch of its
// client's Redis nodes (which are marked down, and the goroutines that
// probe them, shared by every limiter, Policy and Concurrency on the same
// client: see nodeWatch), the in-process stand-ins (fallback.go), and the
// transitions not yet reported to its hook.
type rescue struct {
	e      *engine
	w      *nodeWatch
	locals *lru.Cache[*localSet]

	// answers is what Redis last said of each key (answers.go), with
	// FallbackLocal; else nil.
	answers *answers.Table

	// gone is set once the program has closed the Redis client.
	gone atomic.Bool

	mu       sync.Mutex
	closed   bool
	queue    []Transition // switches not yet reported, oldest first
	draining bool         // a goroutine is reporting the queue
}

// nodeWatch is the down-state of one Redis client's nodes and the
// goroutines that probe them, shared by the limiters built on that client
// with the same clock (the probe's script depends on it), so that an
// outage costs one probe per node and ping interval however many limiters
// share the client. A node's probe key has the prefix of the limiter that
// marked it down (any of theirs will do: they share the client's
// credentials), and the probes go every shortest ping interval of the
// limiters sharing the watch. Each limiter reports the switches to its own
// hook. The last limiter to close stops it.
type nodeWatch struct {
	key    watchKey
	every  atomic.Int64    // ns: the shortest WithPingInterval of subs
	ctx    context.Context // cancelled when the last limiter leaves: ends probes in flight
	cancel context.CancelFunc

	// down maps the id of each node marked down to the error that marked
	// it; nil when no node is down, which is all a healthy call reads.
	down atomic.Pointer[map[string]error]

	mu     sync.Mutex
	subs   map[*rescue]struct{} // the limiters sharing the watch
	nodes  map[string]*node     // nodes marked down, or being checked by a probe
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup // the goroutines that probe
}

// watchKey tells which limiters share a nodeWatch. The clock kind is part
// of it: a probe that calls TIME fails on the servers that WithClientClock
// is for, and one that does not cannot tell a server-clock limiter that
// TIME works.
type watchKey struct {
	rdb         redis.UniversalClient
	clientClock bool // WithClientClock: probes do not call TIME
}

// nodeWatches holds the watch of each watchKey whose client is comparable
// (a map key); a client of another kind gets a watch of its own.
var nodeWatches struct {
	sync.Mutex
	m map[watchKey]*nodeWatch
}

// node is one Redis node that is marked down, or that a probe checks after
// a failure that may have concerned one call only.
type node struct {
	scope
	down  bool      // marked down (else being checked)
	cause error     // the error that marked it down (a call's, or the probe's that confirmed one)
	since time.Time // when it was marked down
}

// probeScript checks what a decision needs: the server's clock, and a write
// (which a replica, a full memory, a loading or a down slot refuses).
var probeScript = redis.NewScript(`redis.call('TIME') redis.call('SET', KEYS[1], '1', 'PX', 1000) return 1`)

// clientClockProbe is probeScript for a limiter with WithClientClock, whose
// decisions never call TIME in a script: the servers it is for refuse that,
// and would refuse every probe. (Its clock reads the plain TIME command,
// again after an outage: a decision that cannot get it fails as any
// other.)
var clientClockProbe = redis.NewScript(`redis.call('SET', KEYS[1], '1', 'PX', 1000) return 1`)

// probeSuffix ends every probe key, which is <prefix>:{<tag>}:p with a tag
// of 1 to 3 letters or digits chosen for its slot. No state key ends so.
const probeSuffix = ":p"

// maxBackoff is how many ping intervals apart probes of a node that cannot
// be reached are sent, at most.
const maxBackoff = 3

// newRescue makes e's fallback state and joins the watch of e's client. A
// node that the watch has marked down already is reported to e's hook
// (see engine.startRescue).
func newRescue(e *engine) *rescue {
	r := &rescue{
		e:      e,
		locals: lru.NewWeighed(e.cfg.localKeys, standIns),
	}
	if e.cfg.fallback == FallbackLocal {
		r.answers = newAnswers(e.cfg.localKeys)
	}
	r.w = joinNodeWatch(r)
	return r
}

// joinNodeWatch returns the watch of r's client and options, with r among
// the limiters sharing it, and queues for r a Down switch of each node it
// has marked down.
func joinNodeWatch(r *rescue) *nodeWatch {
	k := watchKey{rdb: r.e.rdb, clientClock: r.e.cfg.clientClock}
	shared := reflect.TypeOf(k.rdb).Comparable()
	nodeWatches.Lock()
	defer nodeWatches.Unlock()
	var w *nodeWatch
	if shared {
		w = nodeWatches.m[k]
	}
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &nodeWatch{key: k, ctx: ctx, cancel: cancel, subs: make(map[*rescue]struct{}),
			nodes: make(map[string]*node), stop: make(chan struct{})}
		if shared {
			if nodeWatches.m == nil {
				nodeWatches.m = make(map[watchKey]*nodeWatch)
			}
			nodeWatches.m[k] = w
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.subs[r] = struct{}{}
	w.setIntervalLocked()
	for _, n := range w.nodes {
		if n.down {
			r.queue = append(r.queue, Transition{Kind: TransitionDown, Strategy: r.strategy(), Node: n.id, Down: true, Err: n.cause})
		}
	}
	return w
}

// setIntervalLocked sets the interval between probes: the shortest ping
// interval of the limiters sharing w, so that each is probed for as often
// as it asked. w.mu is held.
func (w *nodeWatch) setIntervalLocked() {
	var every time.Duration
	for r := range w.subs {
		if d := r.e.cfg.pingInterval; every == 0 || d < every {
			every = d
		}
	}
	if every > 0 {
		w.every.Store(int64(every))
	}
}

// interval returns the interval between probes.
func (w *nodeWatch) interval() time.Duration { return time.Duration(w.every.Load()) }

// anyDown reports whether any node is marked down.
func (r *rescue) anyDown() bool { return r.w.down.Load() != nil }

// isDown reports whether calls for the state key state go to the fallback:
// whether the node the client sends it to is marked down.
func (r *rescue) isDown(state string) bool {
	m := r.w.down.Load()
	if m == nil {
		return false
	}
	_, down := (*m)[r.scopeID(state)]
	return down
}

// downCause returns the error that marked state's node down, if it is.
func (r *rescue) downCause(state string) error {
	if m := r.w.down.Load(); m != nil {
		return (*m)[r.scopeID(state)]
	}
	return nil
}

// outage reports whether err, met by a call for the state key state, is to
// be answered by the fallback. If err says that the node cannot answer, it
// marks the node down; if err may concern that call only, it has the node
// probed, and marked down only if the probe fails too. An error from a
// Redis client that the program closed is not an outage.
func (r *rescue) outage(err error, state string) bool {
	kind := outage.Classify(err)
	if kind == outage.None {
		return false
	}
	if errors.Is(err, redis.ErrClosed) && outage.ClientClosed(r.w.ctx, r.e.rdb) {
		r.w.setGone()
		return false
	}
	sc := r.scopeOf(state)
	if kind == outage.Node {
		r.w.markDown(sc, err)
	} else {
		r.w.suspect(sc)
	}
	return true
}

func (r *rescue) strategy() Strategy { return r.e.own.rules[0].alg.strategy }

// enqueue queues t for r's hook, unless r is closed.
func (r *rescue) enqueue(t Transition) {
	r.mu.Lock()
	if !r.closed {
		r.queue = append(r.queue, t)
	}
	r.mu.Unlock()
}

// flush reports the queued switches in order, one at a time, unless another
// goroutine is reporting them (it then reports these too). No lock is held
// while the hook runs, so that it may call the limiter, Close included.
// Goroutines counted in the watch's wg call it only after they are done,
// so that Close, waiting for them, never waits for a hook.
func (r *rescue) flush() {
	f := r.e.cfg.onTransition
	r.mu.Lock()
	if f == nil {
		r.queue = nil
	}
	if r.draining {
		r.mu.Unlock()
		return
	}
	r.draining = true
	for len(r.queue) > 0 {
		t := r.queue[0]
		r.queue[0] = Transition{}
		r.queue = r.queue[1:]
		r.mu.Unlock()
		callHook(f, t)
		r.mu.Lock()
	}
	r.queue = nil
	r.draining = false
	r.mu.Unlock()
}

// callHook calls the OnTransition hook f, dropping a panic: the hook runs
// on whichever of the limiter's goroutines noticed the switch (the
// monitor's, for a switch back, where a panic would end the process), and
// reporting must go on for the next switches.
func callHook(f func(Transition), t Transition) {
	defer func() { _ = recover() }()
	f(t)
}

// close takes r off its watch (the last limiter to leave stops the probes
// and waits for them) and drops the switches not reported yet.
func (r *rescue) close() {
	r.mu.Lock()
	r.closed = true
	r.queue = nil
	r.mu.Unlock()
	r.w.leave(r)
}

// leave takes r off the limiters sharing w; the last one to leave stops
// the probes and waits for them.
func (w *nodeWatch) leave(r *rescue) {
	nodeWatches.Lock()
	w.mu.Lock()
	delete(w.subs, r)
	w.setIntervalLocked()
	last := len(w.subs) == 0 && !w.closed
	if last {
		w.closed = true
		close(w.stop)
		w.cancel()
		if reflect.TypeOf(w.key.rdb).Comparable() && nodeWatches.m[w.key] == w {
			delete(nodeWatches.m, w.key)
		}
	}
	w.mu.Unlock()
	nodeWatches.Unlock()
	if last {
		w.wg.Wait()
	}
}

// subscribers returns the limiters sharing w.
func (w *nodeWatch) subscribers() []*rescue {
	w.mu.Lock()
	defer w.mu.Unlock()
	subs := make([]*rescue, 0, len(w.subs))
	for r := range w.subs {
		subs = append(subs, r)
	}
	return subs
}

// flushAll reports the queued switches of every limiter sharing w.
func (w *nodeWatch) flushAll() {
	for _, r := range w.subscribers() {
		r.flush()
	}
}

// setGone records that the program closed the Redis client.
func (w *nodeWatch) setGone() {
	for _, r := range w.subscribers() {
		r.gone.Store(true)
	}
}

// markDown marks the node sc down because of err, and has it probed.
func (w *nodeWatch) markDown(sc scope, err error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	n := w.nodes[sc.id]
	switch {
	case n == nil:
		n = &node{scope: sc}
		w.nodes[sc.id] = n
		w.wg.Add(1)
		go w.monitor(n)
	case n.down:
		w.mu.Unlock()
		return
	}
	// A node being checked has its goroutine already, which goes on
	// probing it once its probe returns.
	w.setDownLocked(n, err)
	w.mu.Unlock()
	w.flushAll()
}

// suspect has the node sc probed once, after an error that may concern one
// call only; unless it is already down or being checked.
func (w *nodeWatch) suspect(sc scope) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || w.nodes[sc.id] != nil {
		return
	}
	n := &node{scope: sc}
	w.nodes[sc.id] = n
	w.wg.Add(1)
	go w.monitor(n)
}

// setDownLocked marks n down and queues the switch for every limiter
// sharing w. w.mu is held.
func (w *nodeWatch) setDownLocked(n *node, err error) {
	n.down, n.cause, n.since = true, err, time.Now()
	w.publishLocked()
	for r := range w.subs {
		r.enqueue(Transition{Kind: TransitionDown, Strategy: r.strategy(), Node: n.id, Down: true, Err: err})
	}
}

// publishLocked updates the map of nodes marked down. w.mu is held.
func (w *nodeWatch) publishLocked() {
	m := make(map[string]error)
	for id, n := range w.nodes {
		if n.down {
			m[id] = n.cause
		}
	}
	if len(m) == 0 {
		w.down.Store(nil)
		return
	}
	w.down.Store(&m)
}

// monitor probes the node n until it is back, then reports the switches.
func (w *nodeWatch) monitor(n *node) {
	w.watch(n)
	w.flushAll()
}

// watch is monitor's loop. A node being checked is probed at once: if the
// probe succeeds, the failure concerned one call and the node is forgotten;
// otherwise it is marked down. A node marked down is probed every ping
// interval (more apart while it cannot be reached) until two probes in a
// row succeed.
func (w *nodeWatch) watch(n *node) {
	defer w.wg.Done()
	if w.checkNode(n) && w.waitBack(n) {
		w.back(n)
	}
}

// checkNode probes a node that is not marked down yet: it forgets the node if
// the probe succeeds, and else marks it down and hands the probing on to a
// new monitor. It reports whether this goroutine goes on probing: only for
// a node that a call marked down meanwhile.
func (w *nodeWatch) checkNode(n *node) bool {
	w.mu.Lock()
	checking := !n.down
	w.mu.Unlock()
	if !checking {
		return true
	}
	err := w.probe(n)
	gone := errors.Is(err, redis.ErrClosed) && outage.ClientClosed(w.ctx, w.key.rdb)
	if gone {
		w.setGone()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.closed:
		return false
	case gone, err == nil && !n.down:
		delete(w.nodes, n.id)
		w.publishLocked()
		return false
	case !n.down:
		w.setDownLocked(n, err)
		// Probe on in a new goroutine; this one reports the switch once it
		// is done (a hook calling Close from a goroutine counted in w.wg
		// would wait for itself).
		w.wg.Add(1)
		go w.monitor(n)
		return false
	}
	return true // marked down by a call meanwhile: go on probing
}

// waitBack probes a node marked down, at the first tick after the wait
// since the last probe, until two probes in a row succeed (true), or the
// last limiter or the client is closed (false). The ticks follow the
// watch's interval, which limiters joining or leaving may change.
func (w *nodeWatch) waitBack(n *node) bool {
	every := w.interval()
	tick := time.NewTicker(every)
	defer tick.Stop()
	wait := every      // between probes; longer while the node cannot be reached
	next := time.Now() // the next probe is due at the first tick after next
	ok := 0
	for {
		select {
		case <-w.stop:
			return false
		case <-tick.C:
		}
		if d := w.interval(); d != every {
			every, wait = d, d
			tick.Reset(every)
		}
		if outage.ClosedNow(w.key.rdb) {
			w.setGone()
			return false
		}
		if time.Now().Before(next) {
			continue
		}
		err := w.probe(n)
		switch {
		case err == nil:
			wait = every
		case errors.Is(err, redis.ErrClosed) && !outage.ClientClosed(w.ctx, w.key.rdb):
			// The client dropped this node (a ring shard removed, say):
			// there is nothing left to wait for.
			err = nil
			ok = 1
		case errors.Is(err, redis.ErrClosed):
			w.setGone()
			return false
		default:
			ok = 0
			wait = w.failed(err, wait)
		}
		next = time.Now().Add(wait - every/2) // due at the first tick after wait
		if err != nil {
			continue
		}
		if ok++; ok >= 2 {
			return true
		}
	}
}

// failed returns the wait before the next probe after a probe failed with
// err, the wait before it having been wait: doubled, up to maxBackoff ping
// intervals, while the node cannot be reached at all, else one interval.
// Through a cluster it also asks the client for a new view of the cluster.
func (w *nodeWatch) failed(err error, wait time.Duration) time.Duration {
	every := w.interval()
	if outage.Unreachable(err) {
		wait = min(2*wait, maxBackoff*every)
	} else {
		wait = every
	}
	// A failed-over cluster slot stays routed to the dead master until the
	// client reloads its view of the cluster, which go-redis does only
	// every ClusterStateReloadInterval (60s by default). Ask for a reload
	// (go-redis runs at most one at a time, 200ms apart).
	if cc, isCluster := w.key.rdb.(*redis.ClusterClient); isCluster {
		cc.ReloadState(context.Background())
	}
	return wait
}

// back forgets a node that answers again, and queues the switch back for
// every limiter's hook (see flush).
func (w *nodeWatch) back(n *node) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	delete(w.nodes, n.id)
	w.publishLocked()
	outage := time.Since(n.since)
	for r := range w.subs {
		if c := r.e.clock; c != nil {
			c.Stale() // the server may have come back on another machine
		}
		r.enqueue(Transition{Kind: TransitionBack, Strategy: r.strategy(), Node: n.id, Outage: outage})
	}
}

// probeTimeout bounds one probe, beyond the client's own timeouts (which
// bound it first when they are shorter, as recommended): through a
// cluster, a probe of a migrating slot takes several round trips (ASK,
// ASKING, NOSCRIPT, EVAL).
const probeTimeout = time.Second

// probe runs the probe script once on the node n.
func (w *nodeWatch) probe(n *node) error {
	ctx, cancel := context.WithTimeout(w.ctx, max(w.interval(), probeTimeout))
	defer cancel()
	if w.key.clientClock {
		return clientClockProbe.Run(ctx, n.probe, []string{n.key}).Err()
	}
	return probeScript.Run(ctx, n.probe, []string{n.key}).Err()
}
