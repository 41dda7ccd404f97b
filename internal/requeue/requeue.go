// Package requeue makes again, in the background, the calls to Redis that
// must not be lost to an outage and that their caller cannot be asked to
// make again: a Concurrency's releases, a reservation's settles.
//
// A [Queue] runs one goroutine, started by the first [Queue.Add] and ended
// when no call is left, which makes the calls pending when kicked (Add
// with now) and every interval, one after the other, each bounded by
// [Timeout]: so a Redis that hangs holds one call's timeout at a time, not
// one per caller. A call whose node is down (the down function given to
// [New]) waits for a later pass; one that Redis did not answer stops the
// pass, and waits with the rest; one past its Until is dropped.
// [Queue.Close] ends the goroutine and, with flush, tries each call once
// more first. A Queue is safe for concurrent use.
package requeue

import (
	"context"
	"sync"
	"time"
)

// Queue is a queue of calls to make again (see the package doc). Make one
// with [New].
type Queue struct {
	down  func(key string) bool // tells which nodes are marked down
	every time.Duration
	max   int // the most calls pending; past it Add refuses

	mu      sync.Mutex
	pending []Call
	passing int                // calls of the pass in flight
	running bool               // the goroutine runs
	cancel  context.CancelFunc // ends the goroutine's call in flight
	closed  bool
	kick    chan struct{} // has the goroutine make a pass at once
	done    chan struct{} // closed by Close
	wg      sync.WaitGroup
}

// Call is one call to make again.
type Call struct {
	// Key tells the call's node: the call is skipped while down(Key) (see
	// New); the limiters give its state key.
	Key string
	// Until is when the call is dropped: from then on it would find
	// nothing to do.
	Until time.Time
	// Do makes the call, and reports whether to make it again: Redis did
	// not answer. A call that Redis answered, with an error reply too, is
	// done.
	Do func(ctx context.Context) (again bool)
}

// Timeout bounds each call a Queue makes, and the last pass of
// Close(true).
const Timeout = time.Second

// New returns a Queue that makes a pass every interval (and when kicked),
// skipping the calls whose Key down reports as down, and that holds at
// most limit calls.
func New(down func(key string) bool, every time.Duration, limit int) *Queue {
	return &Queue{down: down, every: every, max: limit, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// Add queues c, to be made at once if now is set, else at the next pass
// (its node is down: a try would be skipped). It reports false, and
// queues nothing, after Close or when max calls are pending (those of a
// pass in flight included: they are still to be made).
func (q *Queue) Add(c Call, now bool) bool {
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

// Len returns how many calls are pending, those of a pass in flight
// included.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.pending) + q.passing
}

// run makes passes until none is left, or Close.
func (q *Queue) run(ctx context.Context) {
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

// pass makes the calls of batch, each bounded by Timeout and ctx,
// and returns those to make again: those of a node marked down, those
// that Redis did not answer, and, after such a failure, the rest (they
// would wait for the same Redis).
func (q *Queue) pass(ctx context.Context, batch []Call) []Call {
	var keep []Call
	stalled := false
	for _, c := range batch {
		switch {
		case !time.Now().Before(c.Until):
		case stalled || ctx.Err() != nil || q.down(c.Key):
			keep = append(keep, c)
		default:
			cctx, cancel := context.WithTimeout(ctx, Timeout)
			again := c.Do(cctx)
			cancel()
			if again || ctx.Err() != nil {
				keep = append(keep, c)
				stalled = true
			}
		}
	}
	return keep
}

// Close stops the queue: the call in flight ends, and the calls pending
// are dropped; with flush each is tried once more first, within Timeout
// in all (see flush). It returns how many were dropped. It is safe to
// call more than once.
func (q *Queue) Close(flush bool) (dropped int) {
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

// flush tries each call of batch once, within Timeout in all, and
// returns those not made. Unlike a pass, it tries those of a node marked
// down too: the node may answer again before its probes have brought it
// back (a hang that just ended), and there is no later pass. A call that
// Redis does not answer does not stop the others: those of other nodes,
// or the same node answering again, are made while time is left.
func (q *Queue) flush(batch []Call) []Call {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	var keep []Call
	for _, c := range batch {
		switch {
		case !time.Now().Before(c.Until):
		case ctx.Err() != nil:
			keep = append(keep, c)
		case c.Do(ctx):
			keep = append(keep, c)
		}
	}
	return keep
}
