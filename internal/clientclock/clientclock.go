// Package clientclock estimates a Redis server's time from this process's
// clock: the client clock of WithClientClock, which lets a limiter send
// the time with each call instead of having the script call TIME.
//
// A [Clock] measures the offset of the server's clock to the client's (two
// TIME round trips, Cristian's method) and adds it to the client's clock:
// [Clock.NowMicros] returns the server's time in µs, never less than it
// returned before. It measures again every resync interval (10 s), after
// [Clock.Stale] (an outage: the server may have come back on another
// machine), when the client's clock steps, and, in the background, when a
// script found the time sent behind its key's ([Clock.Behind]). One call
// measures while the others wait for it, or go on with the measurement
// before it while that one is fit. [Clock.Close] ends the measurement under
// way. A Clock is safe for concurrent use.
//
// Its errors are the limiter's: their messages start with "redlimit:
// client clock: ".
package clientclock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/errprefix"
)

// Server is what a Clock measures: the go-redis clients implement it.
type Server interface {
	Time(ctx context.Context) *redis.TimeCmd
}

// clockResyncInterval is how often a limiter with WithClientClock
// measures its clock's offset to the Redis server's again.
const clockResyncInterval = 10 * time.Second

// clockStepTolerance is how far a client clock may seem to go back, or its
// wall and monotonic readings drift apart, before the limiter takes it for
// a step and reads the server's time again. Goroutines that read the
// clock in one order and use it in the other make it seem to go back by
// a scheduling delay, well under that.
const clockStepTolerance = 100 * time.Millisecond

// clockMeasureTimeout bounds one measurement (two TIME round trips),
// beyond the client's own timeouts, through the context it passes (which
// go-redis honours with ContextTimeoutEnabled; else the client's dial and
// read timeouts bound it). The measurement does not end with the context
// of the call that started it, as other calls may be waiting for it; it
// keeps that context's values, and ends with Close (the limiter's).
const clockMeasureTimeout = time.Second

// Clock is the client's clock, corrected to the server's. Make one with
// [New].
type Clock struct {
	srv    Server
	now    func() time.Time
	closed error // wrapped by the errors after Close

	base atomic.Pointer[clockBase] // the latest measurement; nil: none, or stale
	last atomic.Int64              // the last time sent, µs
	// asked is when a script last found the time sent behind its key's
	// (Behind), on the client's clock, µs: measured again at most once a
	// clockBehindInterval.
	asked atomic.Int64

	mu     sync.Mutex
	flight *measurement // the measurement under way, if any; guarded by mu
	done   bool         // guarded by mu: closed, no measurement starts

	// The measurements' goroutines: closing ends and waits for them (the
	// limiter's Close).
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// clockBase is one measurement: the server's time at a reading of the
// client's clock. Only seen changes.
type clockBase struct {
	at     time.Time // client's clock, with its monotonic reading (time.Now)
	server int64     // the server's time at at, µs
	// seen is the longest time since at read so far (ns): a clock that
	// reads less went back. Goroutines may store it out of order, which
	// lowers it by a scheduling delay.
	seen atomic.Int64
}

// measurement is one measurement under way: the calls that wait for it
// take its result when done is closed.
type measurement struct {
	done chan struct{}
	base *clockBase
	err  error
}

// New returns a Clock that reads the client's clock with now and the
// server's with srv's TIME; after Close, a call that needs a measurement
// gets an error that wraps closed.
func New(srv Server, now func() time.Time, closed error) *Clock {
	ctx, cancel := context.WithCancel(context.Background())
	return &Clock{srv: srv, now: now, closed: closed, ctx: ctx, cancel: cancel}
}

// Close ends the measurement under way, if any, and waits for it; later
// calls that need one get the closed error given to New.
func (c *Clock) Close() {
	c.mu.Lock()
	c.done = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
}

// Wait waits for the measurement under way, if any, to end (tests that
// move a simulated clock).
func (c *Clock) Wait() {
	c.mu.Lock()
	m := c.flight
	c.mu.Unlock()
	if m != nil {
		<-m.done
	}
}

// clockBehindInterval is the least time between two measurements that
// scripts ask for (Behind): a clock that is right, behind a key written by
// one that is not, learns nothing new from measuring again.
const clockBehindInterval = time.Second

// Behind measures the offset again, in the background, when a script found
// the time sent behind its key's time (a measurement from before a step of
// the server's clock); at most once a clockBehindInterval, and not while
// one is under way. No call waits for it: calls meanwhile send the time
// they would have sent.
func (c *Clock) Behind() {
	now := c.now().UnixMicro()
	last := c.asked.Load()
	if last != 0 && now-last < clockBehindInterval.Microseconds() && now >= last {
		return
	}
	if !c.asked.CompareAndSwap(last, now) {
		return // another call asks
	}
	// (An error is the closed one: nothing to measure. A measurement that fails
	// is made again by the next call that needs one.)
	_, _, _ = c.join(context.Background(), c.base.Load())
}

// Stale makes the next call measure the offset again (after an outage: the
// server may have restarted on another machine).
func (c *Clock) Stale() { c.base.Store(nil) }

// NowMicros returns the server's time in µs, estimated from the client's
// clock and the latest measurement, never less than what it returned
// before.
//
// A measurement that is due (older than clockResyncInterval) is made by
// one call while the others go on with the old one; one that is missing,
// or that a step of the client's clock or a long time (twice the
// interval: the limiter was idle, or measurements kept failing) makes
// unfit, is waited for, by every call, until its context ends.
func (c *Clock) NowMicros(ctx context.Context) (int64, error) {
	for {
		b := c.base.Load()
		now := c.now()
		var elapsed time.Duration
		fit := false
		if b != nil {
			var ok bool
			elapsed, ok = b.since(now)
			fit = ok && elapsed <= 2*clockResyncInterval
			if fit && elapsed <= clockResyncInterval {
				return c.send(b, elapsed), nil
			}
		}
		m, started, err := c.join(ctx, b)
		if err != nil {
			return 0, err
		}
		if m == nil {
			continue // measured meanwhile
		}
		if fit && !started {
			return c.send(b, elapsed), nil // one call measures, the others go on
		}
		select {
		case <-m.done:
		case <-ctx.Done():
			return 0, errorf("client clock: %w", ctx.Err())
		}
		switch {
		case m.err == nil:
			return c.send(m.base, max(c.now().Sub(m.base.at), 0)), nil
		case fit:
			return c.send(b, elapsed), nil // the next call measures again
		}
		return 0, m.err
	}
}

// since returns the time from b to now on the client's clock (its
// monotonic clock when both readings have one), and whether the clock can
// have measured it: not if its wall and monotonic readings disagree (the
// wall clock was set, or the machine slept, which stops the monotonic
// clock), nor if it went back (a clock without monotonic readings, as in
// tests, that was set back).
func (b *clockBase) since(now time.Time) (time.Duration, bool) {
	elapsed := now.Sub(b.at)
	wall := now.Round(0).Sub(b.at.Round(0)) // Round(0) drops the monotonic reading
	if (wall - elapsed).Abs() > clockStepTolerance {
		return elapsed, false
	}
	if b.at != b.at.Round(0) {
		return elapsed, true // monotonic: it cannot go back
	}
	seen := time.Duration(b.seen.Load())
	if elapsed > seen {
		b.seen.Store(int64(elapsed))
	}
	return elapsed, elapsed >= seen-clockStepTolerance
}

// send returns the server's time elapsed after b, or the last time sent
// if that is later, and records it as the last.
func (c *Clock) send(b *clockBase, elapsed time.Duration) int64 {
	t := b.server + elapsed.Microseconds()
	for {
		last := c.last.Load()
		if t <= last {
			return last
		}
		if c.last.CompareAndSwap(last, t) {
			return t
		}
	}
}

// join returns the measurement under way, starting one if none is (then
// started is true); or nil if the base is no longer b (a measurement ended
// since the caller read it); and the closed error once the clock is
// closed. The measurement keeps the values of the caller's ctx, not its
// end (other calls may wait for it), and ends after clockMeasureTimeout or
// at Close.
func (c *Clock) join(ctx context.Context, b *clockBase) (*measurement, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flight != nil {
		return c.flight, false, nil
	}
	if c.done {
		return nil, false, errorf("client clock: %w", c.closed)
	}
	if c.base.Load() != b {
		return nil, false, nil
	}
	m := &measurement{done: make(chan struct{})}
	c.flight = m
	mctx, stop := detach(ctx, c.ctx, clockMeasureTimeout)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer stop()
		c.measure(mctx, m)
	}()
	return m, true, nil
}

// measure makes the measurement m, sets the base if it succeeds, and
// hands m to its waiters.
func (c *Clock) measure(ctx context.Context, m *measurement) {
	m.base, m.err = c.read(ctx)
	c.mu.Lock()
	if m.err == nil {
		c.base.Store(m.base)
	}
	c.flight = nil
	c.mu.Unlock()
	close(m.done)
}

// read reads the server's TIME twice in a row and keeps the reading with
// the shorter round trip, taking the server's answer to be from its middle
// (Cristian's method: off by at most half that round trip). The first
// round trip includes whatever comes before TIME is sent: a dial, the
// connection's handshake (TLS, HELLO, AUTH), a wait for the pool; the
// second, on the connection the first left ready, seldom does.
func (c *Clock) read(ctx context.Context) (*clockBase, error) {
	var best *clockBase
	var bestRTT time.Duration
	for range 2 {
		before := c.now()
		srv, err := c.srv.Time(ctx).Result()
		if err != nil {
			if best != nil {
				break // the first reading will do
			}
			return nil, errorf("client clock: TIME: %w", err)
		}
		rtt := c.now().Sub(before)
		if best == nil || rtt < bestRTT {
			best = &clockBase{at: before.Add(rtt / 2), server: srv.UnixMicro()}
			bestRTT = rtt
		}
	}
	return best, nil
}

// detach returns a context with ctx's values, not its cancellation, that
// ends after timeout or when life ends, and the function that releases it.
func detach(ctx, life context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	stop := context.AfterFunc(life, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// errorf returns an error whose message starts with the limiter's
// "redlimit: " once (see internal/errprefix).
func errorf(format string, args ...any) error {
	return errprefix.Errorf("redlimit: ", format, args...)
}
