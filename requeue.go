package redlimit

import (
	"context"
	"sync"
	"time"
)

// requeue makes again, in the background, the calls to Redis that must
// not be lost to an outage and that the caller cannot be asked to make
// again: a Concurrency's releases, a reservation's settle. One goroutine
// per queue, started on the first call queued and ended when none is left,
// makes them when kicked and every ping interval, skipping those whose node
// is marked down; so a Redis that hangs holds one call's timeout at a time,
// not one per caller.
type requeue struct {
	r     *rescue // tells which nodes are marked down
	every time.Duration
	max   int // the most calls pending; past it add refuses

	mu      sync.Mutex
	pending []requeued
	passing int                // calls of the pass in flight
	running bool               // the goroutine runs
	cancel  context.CancelFunc // ends the goroutine's call in flight
	closed  bool
	kick    chan struct{} // has the goroutine make a pass at once
	done    chan struct{} // closed by close
	wg      sync.WaitGroup
}

// requeued is one call to make again.
type requeued struct {
	state string    // its state key: skipped while its node is down
	until time.Time // dropped from then on: the call would find nothing to do
	// do makes the call, and reports whether to make it again: Redis did
	// not answer. A call that Redis answered, with an error reply too, is
	// done.
	do func(ctx context.Context) (again bool)
}

// requeueTimeout bounds each call a requeue makes, and the last pass of
// close(true).
const requeueTimeout = time.Second

func newRequeue(r *rescue, every time.Duration, max int) *requeue {
	return &requeue{r: r, every: every, max: max, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// add queues c, to be made at once if now is set, else at the next pass
// (its node is down: a try would be skipped). It reports false, and
// queues nothing, after close or when max calls are pending (those of a
// pass in flight included: they are still to be made).
func (q *requeue) add(c requeued, now bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || len(q.pending)+q.passing >= q.max {
		return false
	}
	q.pending = append(q.pending, c)
	if now {
		select {
		case q.kick <- struct{}{}:
		default:
		}
	}
	if !q.running {
		q.running = true
		ctx, cancel := context.WithCancel(context.Background())
		q.cancel = cancel
		q.wg.Add(1)
		go q.run(ctx)
	}
	return true
}

// len returns how many calls are pending, those of a pass in flight
// included.
func (q *requeue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending) + q.passing
}

// run makes passes until none is left, or close.
func (q *requeue) run(ctx context.Context) {
	defer q.wg.Done()
	tick := time.NewTicker(q.every)
	defer tick.Stop()
	for {
		select {
		case <-q.done:
			return
		case <-tick.C:
		case <-q.kick:
		}
		q.mu.Lock()
		batch := q.pending
		q.pending, q.passing = nil, len(batch)
		q.mu.Unlock()
		keep := q.pass(ctx, batch)
		q.mu.Lock()
		q.pending, q.passing = append(keep, q.pending...), 0
		if len(q.pending) == 0 && !q.closed {
			q.running = false
			q.cancel()
			q.cancel = nil
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// pass makes the calls of batch, each bounded by requeueTimeout and ctx,
// and returns those to make again: those of a node marked down, those
// that Redis did not answer, and, after such a failure, the rest (they
// would wait for the same Redis).
func (q *requeue) pass(ctx context.Context, batch []requeued) []requeued {
	var keep []requeued
	stalled := false
	for _, c := range batch {
		switch {
		case !time.Now().Before(c.until):
		case stalled || ctx.Err() != nil || q.r.isDown(c.state):
			keep = append(keep, c)
		default:
			cctx, cancel := context.WithTimeout(ctx, requeueTimeout)
			again := c.do(cctx)
			cancel()
			if again || ctx.Err() != nil {
				keep = append(keep, c)
				stalled = true
			}
		}
	}
	return keep
}

// close stops the queue: the call in flight ends, and the calls pending
// are dropped; with flush each is tried once more first, within
// requeueTimeout in all (see flush). It returns how many were dropped. It
// is safe to call more than once.
func (q *requeue) close(flush bool) (dropped int) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		q.wg.Wait()
		return 0
	}
	q.closed = true
	close(q.done)
	if q.cancel != nil {
		q.cancel()
	}
	q.mu.Unlock()
	q.wg.Wait()
	q.mu.Lock()
	batch := q.pending
	q.pending = nil
	q.mu.Unlock()
	if flush && len(batch) > 0 {
		batch = q.flush(batch)
	}
	return len(batch)
}

// flush tries each call of batch once, within requeueTimeout in all, and
// returns those not made. Unlike a pass, it tries those of a node marked
// down too: the node may answer again before its probes have brought it
// back (a hang that just ended), and there is no later pass. A call that
// Redis does not answer does not stop the others: those of other nodes,
// or the same node answering again, are made while time is left.
func (q *requeue) flush(batch []requeued) []requeued {
	ctx, cancel := context.WithTimeout(context.Background(), requeueTimeout)
	defer cancel()
	var keep []requeued
	for _, c := range batch {
		switch {
		case !time.Now().Before(c.until):
		case ctx.Err() != nil:
			keep = append(keep, c)
		case c.do(ctx):
			keep = append(keep, c)
		}
	}
	return keep
}
