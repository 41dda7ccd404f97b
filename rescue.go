package redlimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// FallbackPolicy says what a limiter answers while Redis is unavailable.
//
// Redis is marked unavailable by the first call that fails for a reason that
// says so: a refused, reset or closed connection, EOF, an i/o or pool
// timeout, or a LOADING, READONLY, CLUSTERDOWN, TRYAGAIN, MASTERDOWN, OOM,
// BUSY, NOREPLICAS or MISCONF reply. From then on calls do not touch Redis: they are answered at
// in-process speed, with Result.Degraded set, and a monitor goroutine probes
// Redis every ping interval (see [WithPingInterval]) by running a small
// script that reads TIME and writes a key in the failing key's slot (so a
// read-only replica, a full memory or a down cluster slot does not count as
// back). After two probes in a row succeed, calls go to Redis again.
//
// What is not an outage never switches to the fallback: a denial is an
// answer, the caller's own context ending returns its error, and any other
// error (a script or argument error is a bug) is returned as it is.
type FallbackPolicy int

// The fallback policies.
const (
	// FallbackLocal answers from an in-process golang.org/x/time/rate
	// limiter per key, with the strategy's rate and burst scaled by the
	// fallback share (see [WithFallbackShare]). It is the default.
	//
	// The stand-ins: FixedWindow, SlidingLog and SlidingCounter become a
	// token bucket of Rate/Period per second with burst Rate; TokenBucket
	// keeps Rate/Period and Burst; LeakyBucket keeps its queue (a
	// rate.Limiter of burst 1 whose Reserve gives the Delay, with at most
	// Burst queued). State in Redis is not copied in or out: the local
	// limiters start full, and Redis resumes from what it had.
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

// Transition tells that a limiter switched to its fallback (Down) or back to
// Redis. See [WithOnTransition].
type Transition struct {
	Strategy Strategy
	Down     bool          // true: Redis marked unavailable; false: back on Redis
	Err      error         // Down: the error that marked Redis unavailable
	Outage   time.Duration // back on Redis: how long it was marked unavailable
}

// WithFallback sets what the limiter answers while Redis is unavailable.
// The default is FallbackLocal.
func WithFallback(p FallbackPolicy) Option {
	return optionFunc(func(c *config) { c.fallback = p })
}

// WithPingInterval sets how often the monitor probes Redis while it is
// marked unavailable. The default is 100ms. Two probes in a row must succeed
// before calls go back to Redis.
func WithPingInterval(d time.Duration) Option {
	return optionFunc(func(c *config) { c.pingInterval = d })
}

// WithFallbackShare scales the in-process fallback limits to this
// instance's share of the global limit, in (0, 1]. With N instances behind
// one Redis, 1/N makes the fleet admit about the global limit during an
// outage, instead of N times it. The default is 1.
//
// The trade-off: with 1/N, keys whose traffic reaches only some instances
// (sticky sessions, one client's connection) get less than the global limit
// while Redis is down. For login attempts, password resets and other
// security limits, prefer a share of 1/N (or FallbackDeny): over-admission
// there is the risk; for API quotas, 1 keeps users unaffected.
func WithFallbackShare(share float64) Option {
	return optionFunc(func(c *config) { c.share = share })
}

// WithFallbackKeys bounds the number of keys the in-process fallback keeps
// limiters for; beyond it the least recently used are dropped (and start
// full if they come back). The default is 100,000 keys, about 20 MB at most.
func WithFallbackKeys(max int) Option {
	return optionFunc(func(c *config) { c.localKeys = max })
}

// WithOnTransition sets a function called when the limiter switches to its
// fallback and when it switches back to Redis. It is called once per switch
// (never per call), from the goroutine that noticed, and must not block.
// Use it to log or count outages.
func WithOnTransition(f func(Transition)) Option {
	return optionFunc(func(c *config) { c.onTransition = f })
}

// rescue holds a limiter's fallback state: whether Redis is marked down,
// the monitor that probes it, and the in-process stand-ins (fallback.go).
type rescue struct {
	e      *engine
	down   atomic.Bool
	locals *lru[*localSet]

	mu       sync.Mutex
	cause    error     // the error that marked Redis down
	since    time.Time // when it was marked down
	probeKey string    // a key in the slot that failed
	running  bool      // the monitor goroutine runs
	closed   bool
	stop     chan struct{}
	wg       sync.WaitGroup
}

// probeScript checks what a decision needs: the server's clock, and a write
// (which a replica, a full memory, a loading or a down slot refuses).
var probeScript = redis.NewScript(`redis.call('TIME') redis.call('SET', KEYS[1], '1', 'PX', 1000) return 1`)

const probeSuffix = ":p"

func newRescue(e *engine) *rescue {
	return &rescue{
		e:      e,
		locals: newLRU[*localSet](e.cfg.localKeys),
		stop:   make(chan struct{}),
	}
}

// anyDown reports whether any calls go to the fallback.
func (r *rescue) anyDown() bool { return r.down.Load() }

// isDown reports whether calls for the state key state go to the fallback.
func (r *rescue) isDown(state string) bool { return r.down.Load() }

// outage reports whether err, met on the state key state, means that Redis
// cannot answer now; if so it marks Redis down.
func (r *rescue) outage(ctx context.Context, err error, state string) bool {
	if !isUnavailable(err) {
		return false
	}
	r.markDown(err, state)
	return true
}

// markDown marks Redis unavailable because of err, met on state's key, and
// starts the monitor.
func (r *rescue) markDown(err error, state string) {
	r.mu.Lock()
	if r.closed || r.down.Load() {
		r.mu.Unlock()
		return
	}
	r.down.Store(true)
	r.cause = err
	r.since = time.Now()
	r.probeKey = state + probeSuffix
	r.running = true
	r.wg.Add(1)
	go r.monitor()
	r.mu.Unlock()
	r.notify(Transition{Strategy: r.e.own.rules[0].alg.strategy, Down: true, Err: err})
}

func (r *rescue) notify(t Transition) {
	if f := r.e.cfg.onTransition; f != nil {
		f(t)
	}
}

// monitor probes Redis until two probes in a row succeed, then switches
// back. It tells the transition hook after it is done, so that the hook may
// call Close.
func (r *rescue) monitor() {
	if outage, back := r.watch(); back {
		r.notify(Transition{Strategy: r.e.own.rules[0].alg.strategy, Outage: outage})
	}
}

// watch is the monitor's loop; it reports whether Redis is back.
func (r *rescue) watch() (time.Duration, bool) {
	defer r.wg.Done()
	every := r.e.cfg.pingInterval
	tick := time.NewTicker(every)
	defer tick.Stop()
	r.mu.Lock()
	key := r.probeKey
	r.mu.Unlock()
	ok := 0
	for {
		select {
		case <-r.stop:
			return 0, false
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(every, 100*time.Millisecond))
		err := probeScript.Run(ctx, r.e.rdb, []string{key}).Err()
		cancel()
		if err != nil {
			ok = 0
			// A failed-over cluster slot stays routed to the dead master
			// until the client reloads its view of the cluster, which
			// go-redis does only every ClusterStateReloadInterval (60s by
			// default). Ask for a reload (go-redis runs at most one at a
			// time, 200ms apart).
			if cc, isCluster := r.e.rdb.(*redis.ClusterClient); isCluster {
				cc.ReloadState(context.Background())
			}
			continue
		}
		if ok++; ok < 2 {
			continue
		}
		if c := r.e.clock; c != nil {
			c.stale() // the server may have come back on another machine
		}
		r.mu.Lock()
		outage := time.Since(r.since)
		r.running = false
		r.down.Store(false)
		r.mu.Unlock()
		return outage, true
	}
}

// close stops the monitor and waits for it.
func (r *rescue) close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.stop)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// isUnavailable reports whether err says that Redis cannot answer now, as
// opposed to an answer or a bug.
func isUnavailable(err error) bool {
	var netErr net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrPoolExhausted), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.As(err, &netErr):
		return true
	}
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) ||
		redis.IsClusterDownError(err) || redis.IsTryAgainError(err) ||
		redis.IsMasterDownError(err) || redis.IsOOMError(err) ||
		redis.IsMaxClientsError(err) || redis.HasErrorPrefix(err, "BUSY ") ||
		redis.HasErrorPrefix(err, "NOREPLICAS") || redis.HasErrorPrefix(err, "MISCONF") ||
		// Redis 6 wraps a script's OOM: "ERR Error running script (call to
		// f_...): @user_script:269: @user_script: 269: -OOM command not allowed ...".
		redis.HasErrorPrefix(err, "Error running script") && strings.Contains(err.Error(), ": -OOM ")
}
