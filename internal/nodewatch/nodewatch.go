// Package nodewatch keeps which Redis nodes behind a client are down, for
// the limiters that share the client. An error that says a node cannot
// answer marks it down at once; one that may concern one call has the node
// probed at once, and marked down only if the probe fails too. A node
// marked down is probed every ping interval (further apart while it cannot
// be reached) until two probes in a row succeed. The set of nodes down is
// published for every call to read with one atomic load; each switch is
// queued for every subscriber under the watch's lock, then flushed with no
// lock held, so that a subscriber's hook may call back.
//
// The scope of down-state is one node, never Redis as a whole: the node
// that serves the failing key, as the client routes it (see locate). A node
// is probed with a short key of the failing key's slot, never with the
// caller's key, so that a huge or odd key cannot make probes fail.
package nodewatch

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/outage"
)

// Key tells which subscribers share a Watch: those of one client that probe
// with the same script.
type Key struct {
	Client redis.UniversalClient
	// Probe checks what a decision needs of a node (a write, and TIME
	// unless decisions never call it), run with the probe key as KEYS[1].
	Probe *redis.Script
}

// Event is a switch of one node: down (Err set), or back (Outage set).
type Event struct {
	Node   string        // the node's address; "" for the whole client
	Down   bool          // true: marked down; false: back
	Err    error         // Down: the error that marked it down
	Outage time.Duration // back: how long it was marked down
}

// Sub is a subscriber of a Watch: a limiter. It must be comparable.
type Sub interface {
	Interval() time.Duration // the ping interval it asks for; the watch probes at its subs' shortest
	Queue(e Event)           // queues a switch; called with the watch's lock held, so it must not call the watch
	Flush()                  // reports the switches queued; called with no lock held
	Gone()                   // the program closed the client
}

// Watch is the down-state of one client's nodes and the goroutines that
// probe them, shared by the subscribers of one Key, so that an outage
// costs one probe per node and ping interval however many limiters share
// the client. The last subscriber to leave stops it.
type Watch struct {
	key    Key
	every  atomic.Int64    // ns: the shortest Interval of subs
	ctx    context.Context // cancelled when the last subscriber leaves: ends probes in flight
	cancel context.CancelFunc

	// down maps the id of each node marked down to the error that marked
	// it; nil when no node is down, which is all a healthy call reads.
	down atomic.Pointer[map[string]error]

	mu     sync.Mutex
	subs   map[Sub]struct{}
	nodes  map[string]*node // nodes marked down, or being checked by a probe
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup // the goroutines that probe
}

// watches holds the watch of each Key whose client is comparable (a map
// key); a client of another kind gets a watch of its own.
var watches struct {
	sync.Mutex
	m map[Key]*Watch
}

// node is one Redis node that is marked down, or that a probe checks after
// a failure that may have concerned one call only.
type node struct {
	scope
	down  bool      // marked down (else being checked)
	cause error     // the error that marked it down (a call's, or the probe's that confirmed one)
	since time.Time // when it was marked down
}

// Join returns the watch of k, with s among its subscribers, and queues for
// s a Down switch of each node marked down already (s flushes it).
func Join(k Key, s Sub) *Watch {
	shared := reflect.TypeOf(k.Client).Comparable()
	watches.Lock()
	defer watches.Unlock()
	var w *Watch
	if shared {
		w = watches.m[k]
	}
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &Watch{key: k, ctx: ctx, cancel: cancel, subs: make(map[Sub]struct{}),
			nodes: make(map[string]*node), stop: make(chan struct{})}
		if shared {
			if watches.m == nil {
				watches.m = make(map[Key]*Watch)
			}
			watches.m[k] = w
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.subs[s] = struct{}{}
	w.setIntervalLocked()
	for _, n := range w.nodes {
		if n.down {
			s.Queue(Event{Node: n.id, Down: true, Err: n.cause})
		}
	}
	return w
}

// Watching returns how many watches of rdb are shared (the tests check
// that a limiter leaves none behind).
func Watching(rdb redis.UniversalClient) int {
	watches.Lock()
	defer watches.Unlock()
	n := 0
	for k := range watches.m {
		if k.Client == rdb {
			n++
		}
	}
	return n
}

// Leave takes s off the subscribers of w; the last one to leave stops the
// probes and waits for them.
func (w *Watch) Leave(s Sub) {
	watches.Lock()
	w.mu.Lock()
	delete(w.subs, s)
	w.setIntervalLocked()
	last := len(w.subs) == 0 && !w.closed
	if last {
		w.closed = true
		close(w.stop)
		w.cancel()
		if reflect.TypeOf(w.key.Client).Comparable() && watches.m[w.key] == w {
			delete(watches.m, w.key)
		}
	}
	w.mu.Unlock()
	watches.Unlock()
	if last {
		w.wg.Wait()
	}
}

// Stopped reports whether the last subscriber has left w.
func (w *Watch) Stopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// setIntervalLocked sets the interval between probes: the shortest ping
// interval of the subscribers, so that each is probed for as often as it
// asked. w.mu is held.
func (w *Watch) setIntervalLocked() {
	var every time.Duration
	for s := range w.subs {
		if d := s.Interval(); every == 0 || d < every {
			every = d
		}
	}
	if every > 0 {
		w.every.Store(int64(every))
	}
}

// Interval returns the interval between probes.
func (w *Watch) Interval() time.Duration { return time.Duration(w.every.Load()) }

// AnyDown reports whether any node is marked down.
func (w *Watch) AnyDown() bool { return w.down.Load() != nil }

// IsDown reports whether the node the client sends the key state to is
// marked down. It does not touch the network.
func (w *Watch) IsDown(state string) bool {
	m := w.down.Load()
	if m == nil {
		return false
	}
	_, down := (*m)[nodeID(w.key.Client, state)]
	return down
}

// Cause returns the error that marked down the node of the key state, or
// nil if it is not down.
func (w *Watch) Cause(state string) error {
	if m := w.down.Load(); m != nil {
		return (*m)[nodeID(w.key.Client, state)]
	}
	return nil
}

// Outage reports whether err, met by a call for the key state of a limiter
// with this key prefix, is to be answered by the fallback. If err says
// that the node cannot answer, it marks the node down; if err may concern
// that call only, it has the node probed, and marked down only if the
// probe fails too. An error from a client that the program closed is not
// an outage (the subscribers are told Gone).
func (w *Watch) Outage(prefix, state string, err error) bool {
	kind := outage.Classify(err)
	if kind == outage.None {
		return false
	}
	if w.clientGone(err) {
		w.setGone()
		return false
	}
	sc := locate(w.key.Client, prefix, state)
	if kind == outage.Node {
		w.markDown(sc, err)
	} else {
		w.suspect(sc)
	}
	return true
}

// clientGone reports whether err says that the program closed the client.
func (w *Watch) clientGone(err error) bool {
	return errors.Is(err, redis.ErrClosed) && outage.ClientClosed(w.ctx, w.key.Client)
}

// subscribers returns the subscribers of w.
func (w *Watch) subscribers() []Sub {
	w.mu.Lock()
	defer w.mu.Unlock()
	subs := make([]Sub, 0, len(w.subs))
	for s := range w.subs {
		subs = append(subs, s)
	}
	return subs
}

// flushAll has every subscriber report its queued switches.
func (w *Watch) flushAll() {
	for _, s := range w.subscribers() {
		s.Flush()
	}
}

// setGone tells every subscriber that the program closed the client.
func (w *Watch) setGone() {
	for _, s := range w.subscribers() {
		s.Gone()
	}
}
