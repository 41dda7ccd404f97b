package redlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/lru"
	"github.com/redlimit/redlimit/internal/outage"
)

// FallbackPolicy says what a limiter answers while Redis is unavailable.
//
// # What is marked down
//
// Down-state is kept per Redis node, never for Redis as a whole: the node
// that serves the failing key, as the client routes it. For a
// *redis.Client (a FailoverClient too) that is its one server; for a
// *redis.ClusterClient, the master of the key's slot (so one failed master,
// with cluster-require-full-coverage no, sends only its own slots to the
// fallback, and a slot that fails over comes back as soon as the client
// routes it to the promoted replica); for a *redis.Ring, the key's shard.
// An *redis.AutoPipeliner, or any other client type, is one node. Calls for
// keys on other nodes keep going to Redis.
//
// A node is marked down at once by a call that fails for a reason that
// concerns the whole node: a refused connection or failed dial, no ring
// shard or cluster node left, unreachable sentinels, or a LOADING,
// READONLY, CLUSTERDOWN, MASTERDOWN, OOM, BUSY, NOREPLICAS, MISCONF or
// max-clients reply. A failure that may concern that one call only (a
// timeout, a connection lost mid-call, a pool or pipeline queue that is
// full, or during a slot migration a TRYAGAIN, or a MOVED or ASK left
// after go-redis's redirects) answers that call from the fallback and
// marks nothing: a probe of the node is sent at once, and the node is
// marked down only if the probe fails too. So one slow call (an
// expensive key, a brief stall) cannot take other keys off Redis. Such a
// call may have been counted by Redis as well as by the fallback.
//
// From then on calls for keys on that node do not touch Redis: they are
// answered at in-process speed, with Result.Degraded set, and a monitor
// goroutine probes the node every ping interval (see [WithPingInterval]) by
// running a small script that reads TIME and writes a short key of the
// failing key's slot (never the caller's key; and a read-only replica, a
// full memory or a down cluster slot does not count as back). After two
// probes in a row succeed, calls go to the node again.
//
// What is not an outage never switches to the fallback: a denial is an
// answer, the caller's own context ending returns its error, a Redis client
// that the program closed returns an error wrapping redis.ErrClosed (the
// constructors reject one), and any other error (a script or argument
// error is a bug) is returned as it is.
type FallbackPolicy int

// The fallback policies.
const (
	// FallbackLocal answers from an in-process golang.org/x/time/rate
	// limiter per key, with the strategy's rate and burst scaled by the
	// fallback share (see [WithFallbackShare]). It is the default.
	//
	// The stand-ins: FixedWindow, SlidingLog and SlidingCounter become a
	// token bucket of Rate/Period per second with burst Rate (a calendar
	// quota, [Daily], [Weekly], [Monthly]: the instance's share of the
	// quota at once, then Rate per the calendar's nominal Period); TokenBucket
	// keeps Rate/Period and Burst; LeakyBucket keeps its queue (a
	// rate.Limiter of burst 1 whose Reserve gives the Delay, with at most
	// Burst queued). State in Redis is not copied in or out: the local
	// limiters start full, and Redis resumes from what it had; but a key
	// that Redis denied under a penalty block ([WithBlock]) stays denied
	// until the block ends.
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
// (Down) or back to Redis. See [WithOnTransition].
type Transition struct {
	Strategy Strategy
	// Node is the address of the node (a cluster master or a ring shard)
	// whose keys switched, or "" when the switch concerns the whole client
	// (a *redis.Client, an AutoPipeliner, or a cluster or ring that could
	// not route the key).
	Node   string
	Down   bool          // true: the node marked unavailable; false: back on Redis
	Err    error         // Down: the error that marked it unavailable
	Outage time.Duration // back on Redis: how long it was marked unavailable
	// Evicted, when above 0, makes this a notice, not a switch: the node
	// (its address, even for a *redis.Client) evicted that many keys
	// between two samples (see [WithEvictionCheck]); Down is false and
	// Err wraps ErrEvictionPolicy.
	Evicted int64
}

// rescue holds a limiter's fallback state: which Redis nodes are marked
// down, the goroutines that probe them, the in-process stand-ins
// (fallback.go), and the transitions not yet reported.
type rescue struct {
	e      *engine
	locals *lru.Cache[*localSet]
	ctx    context.Context // cancelled by close: ends probes in flight
	cancel context.CancelFunc

	// down maps the id of each node marked down to the error that marked
	// it; nil when no node is down, which is all a healthy call reads.
	down atomic.Pointer[map[string]error]
	// gone is set once the program has closed the Redis client.
	gone atomic.Bool

	mu       sync.Mutex
	nodes    map[string]*node // nodes marked down, or being checked by a probe
	closed   bool
	stop     chan struct{}
	wg       sync.WaitGroup // the goroutines that probe
	queue    []Transition   // switches not yet reported, oldest first
	draining bool           // a goroutine is reporting the queue
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

func newRescue(e *engine) *rescue {
	ctx, cancel := context.WithCancel(context.Background())
	return &rescue{
		e:      e,
		locals: lru.NewWeighed(e.cfg.localKeys, standIns),
		ctx:    ctx,
		cancel: cancel,
		nodes:  make(map[string]*node),
		stop:   make(chan struct{}),
	}
}

// anyDown reports whether any node is marked down.
func (r *rescue) anyDown() bool { return r.down.Load() != nil }

// isDown reports whether calls for the state key state go to the fallback:
// whether the node the client sends it to is marked down.
func (r *rescue) isDown(state string) bool {
	m := r.down.Load()
	if m == nil {
		return false
	}
	_, down := (*m)[r.scopeID(state)]
	return down
}

// downCause returns the error that marked state's node down, if it is.
func (r *rescue) downCause(state string) error {
	if m := r.down.Load(); m != nil {
		return (*m)[r.scopeID(state)]
	}
	return nil
}

// outage reports whether err, met by a call for the state key state, is to
// be answered by the fallback. If err says that the node cannot answer, it
// marks the node down; if err may concern that call only, it has the node
// probed, and marked down only if the probe fails too. An error from a
// Redis client that the program closed is not an outage.
func (r *rescue) outage(ctx context.Context, err error, state string) bool {
	kind := outage.Classify(err)
	if kind == outage.None {
		return false
	}
	if errors.Is(err, redis.ErrClosed) && clientClosed(r.ctx, r.e.rdb) {
		r.gone.Store(true)
		return false
	}
	sc := r.scopeOf(state)
	if kind == outage.Node {
		r.markDown(sc, err)
	} else {
		r.suspect(sc)
	}
	return true
}

// markDown marks the node sc down because of err, and has it probed.
func (r *rescue) markDown(sc scope, err error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	n := r.nodes[sc.id]
	switch {
	case n == nil:
		n = &node{scope: sc}
		r.nodes[sc.id] = n
		r.wg.Add(1)
		go r.monitor(n)
	case n.down:
		r.mu.Unlock()
		return
	}
	// A node being checked has its goroutine already, which goes on
	// probing it once its probe returns.
	r.setDownLocked(n, err)
	r.mu.Unlock()
	r.flush()
}

// suspect has the node sc probed once, after an error that may concern one
// call only; unless it is already down or being checked.
func (r *rescue) suspect(sc scope) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.nodes[sc.id] != nil {
		return
	}
	n := &node{scope: sc}
	r.nodes[sc.id] = n
	r.wg.Add(1)
	go r.monitor(n)
}

// setDownLocked marks n down and queues the switch. r.mu is held.
func (r *rescue) setDownLocked(n *node, err error) {
	n.down, n.cause, n.since = true, err, time.Now()
	r.publishLocked()
	r.queue = append(r.queue, Transition{Strategy: r.strategy(), Node: n.id, Down: true, Err: err})
}

// publishLocked updates the map of nodes marked down. r.mu is held.
func (r *rescue) publishLocked() {
	m := make(map[string]error)
	for id, n := range r.nodes {
		if n.down {
			m[id] = n.cause
		}
	}
	if len(m) == 0 {
		r.down.Store(nil)
		return
	}
	r.down.Store(&m)
}

func (r *rescue) strategy() Strategy { return r.e.own.rules[0].alg.strategy }

// flush reports the queued switches in order, one at a time, unless another
// goroutine is reporting them (it then reports these too). No lock is held
// while the hook runs, so that it may call the limiter, Close included.
// Goroutines counted in r.wg call it only after they are done, so that
// Close, waiting for them, never waits for a hook.
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

// monitor probes the node n until it is back, then reports the switches.
func (r *rescue) monitor(n *node) {
	r.watch(n)
	r.flush()
}

// watch is monitor's loop. A node being checked is probed at once: if the
// probe succeeds, the failure concerned one call and the node is forgotten;
// otherwise it is marked down. A node marked down is probed every ping
// interval (more apart while it cannot be reached) until two probes in a
// row succeed.
func (r *rescue) watch(n *node) {
	defer r.wg.Done()
	if r.checkNode(n) && r.waitBack(n) {
		r.back(n)
	}
}

// checkNode probes a node that is not marked down yet: it forgets the node if
// the probe succeeds, and else marks it down and hands the probing on to a
// new monitor. It reports whether this goroutine goes on probing: only for
// a node that a call marked down meanwhile.
func (r *rescue) checkNode(n *node) bool {
	r.mu.Lock()
	checking := !n.down
	r.mu.Unlock()
	if !checking {
		return true
	}
	err := r.probe(n)
	gone := errors.Is(err, redis.ErrClosed) && clientClosed(r.ctx, r.e.rdb)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return false
	case gone:
		r.gone.Store(true)
		fallthrough
	case err == nil && !n.down:
		delete(r.nodes, n.id)
		r.publishLocked()
		return false
	case !n.down:
		r.setDownLocked(n, err)
		// Probe on in a new goroutine; this one reports the switch once it
		// is done (a hook calling Close from a goroutine counted in r.wg
		// would wait for itself).
		r.wg.Add(1)
		go r.monitor(n)
		return false
	}
	return true // marked down by a call meanwhile: go on probing
}

// waitBack probes a node marked down, at the first tick after the wait
// since the last probe, until two probes in a row succeed (true), or the
// limiter or its client is closed (false).
func (r *rescue) waitBack(n *node) bool {
	every := r.e.cfg.pingInterval
	tick := time.NewTicker(every)
	defer tick.Stop()
	wait := every      // between probes; longer while the node cannot be reached
	next := time.Now() // the next probe is due at the first tick after next
	ok := 0
	for {
		select {
		case <-r.stop:
			return false
		case <-tick.C:
		}
		if closedNow(r.e.rdb) {
			r.gone.Store(true)
			return false
		}
		if time.Now().Before(next) {
			continue
		}
		err := r.probe(n)
		switch {
		case err == nil:
			wait = every
		case errors.Is(err, redis.ErrClosed) && !clientClosed(r.ctx, r.e.rdb):
			// The client dropped this node (a ring shard removed, say):
			// there is nothing left to wait for.
			err = nil
			ok = 1
		case errors.Is(err, redis.ErrClosed):
			r.gone.Store(true)
			return false
		default:
			ok = 0
			wait = r.failed(err, wait)
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
func (r *rescue) failed(err error, wait time.Duration) time.Duration {
	every := r.e.cfg.pingInterval
	if outage.Unreachable(err) {
		wait = min(2*wait, maxBackoff*every)
	} else {
		wait = every
	}
	// A failed-over cluster slot stays routed to the dead master until the
	// client reloads its view of the cluster, which go-redis does only
	// every ClusterStateReloadInterval (60s by default). Ask for a reload
	// (go-redis runs at most one at a time, 200ms apart).
	if cc, isCluster := r.e.rdb.(*redis.ClusterClient); isCluster {
		cc.ReloadState(context.Background())
	}
	return wait
}

// back forgets a node that answers again, and queues the switch back for
// the hook (see flush).
func (r *rescue) back(n *node) {
	if c := r.e.clock; c != nil {
		c.stale() // the server may have come back on another machine
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		delete(r.nodes, n.id)
		r.publishLocked()
		r.queue = append(r.queue, Transition{Strategy: r.strategy(), Node: n.id, Outage: time.Since(n.since)})
	}
}

// probeTimeout bounds one probe, beyond the client's own timeouts (which
// bound it first when they are shorter, as recommended): through a
// cluster, a probe of a migrating slot takes several round trips (ASK,
// ASKING, NOSCRIPT, EVAL).
const probeTimeout = time.Second

// probe runs the probe script once on the node n.
func (r *rescue) probe(n *node) error {
	ctx, cancel := context.WithTimeout(r.ctx, max(r.e.cfg.pingInterval, probeTimeout))
	defer cancel()
	if r.e.clock != nil {
		return clientClockProbe.Run(ctx, n.probe, []string{n.key}).Err()
	}
	return probeScript.Run(ctx, n.probe, []string{n.key}).Err()
}

// close stops the probes and waits for them.
func (r *rescue) close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.stop)
		r.cancel()
	}
	r.mu.Unlock()
	r.wg.Wait()
}
