package nodewatch

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/outage"
)

// maxBackoff is how many ping intervals apart probes of a node that cannot
// be reached are sent, at most.
const maxBackoff = 3

// probeTimeout bounds one probe, beyond the client's own timeouts (which
// bound it first when they are shorter, as recommended): through a
// cluster, a probe of a migrating slot takes several round trips (ASK,
// ASKING, NOSCRIPT, EVAL).
const probeTimeout = time.Second

// markDown marks the node sc down because of err, and has it probed.
func (w *Watch) markDown(sc scope, err error) {
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
func (w *Watch) suspect(sc scope) {
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

// setDownLocked marks n down and queues the switch for every subscriber.
// w.mu is held.
func (w *Watch) setDownLocked(n *node, err error) {
	n.down, n.cause, n.since = true, err, time.Now()
	w.publishLocked()
	for s := range w.subs {
		s.Queue(Event{Node: n.id, Down: true, Err: err})
	}
}

// publishLocked updates the map of nodes marked down. w.mu is held.
func (w *Watch) publishLocked() {
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
// Goroutines counted in w.wg flush only once they are done, so that Leave,
// waiting for them, never waits for a subscriber's hook.
func (w *Watch) monitor(n *node) {
	w.watch(n)
	w.flushAll()
}

// watch is monitor's loop. A node being checked is probed at once: if the
// probe succeeds, the failure concerned one call and the node is forgotten;
// otherwise it is marked down. A node marked down is probed every ping
// interval (more apart while it cannot be reached) until two probes in a
// row succeed.
func (w *Watch) watch(n *node) {
	defer w.wg.Done()
	if w.checkNode(n) && w.waitBack(n) {
		w.back(n)
	}
}

// checkNode probes a node that is not marked down yet: it forgets the node if
// the probe succeeds, and else marks it down and hands the probing on to a
// new monitor. It reports whether this goroutine goes on probing: only for
// a node that a call marked down meanwhile.
func (w *Watch) checkNode(n *node) bool {
	w.mu.Lock()
	checking := !n.down
	w.mu.Unlock()
	if !checking {
		return true
	}
	err := w.probe(n)
	gone := w.clientGone(err)
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
// last subscriber leaves or the client is closed (false). The ticks follow
// the watch's interval, which subscribers joining or leaving may change.
func (w *Watch) waitBack(n *node) bool {
	every := w.Interval()
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
		if d := w.Interval(); d != every {
			every, wait = d, d
			tick.Reset(every)
		}
		if outage.ClosedNow(w.key.Client) {
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
		case errors.Is(err, redis.ErrClosed) && !outage.ClientClosed(w.ctx, w.key.Client):
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
func (w *Watch) failed(err error, wait time.Duration) time.Duration {
	every := w.Interval()
	if outage.Unreachable(err) {
		wait = min(2*wait, maxBackoff*every)
	} else {
		wait = every
	}
	// A failed-over cluster slot stays routed to the dead master until the
	// client reloads its view of the cluster, which go-redis does only
	// every ClusterStateReloadInterval (60s by default). Ask for a reload
	// (go-redis runs at most one at a time, 200ms apart).
	if cc, isCluster := w.key.Client.(*redis.ClusterClient); isCluster {
		cc.ReloadState(context.Background())
	}
	return wait
}

// back forgets a node that answers again, and queues the switch back for
// every subscriber.
func (w *Watch) back(n *node) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	delete(w.nodes, n.id)
	w.publishLocked()
	e := Event{Node: n.id, Outage: time.Since(n.since)}
	for s := range w.subs {
		s.Queue(e)
	}
}

// probe runs the probe script once on the node n.
func (w *Watch) probe(n *node) error {
	ctx, cancel := context.WithTimeout(w.ctx, max(w.Interval(), probeTimeout))
	defer cancel()
	return w.key.Probe.Run(ctx, n.probe, []string{n.key}).Err()
}
