package redlimit

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/answers"
	"github.com/redlimit/redlimit/internal/hookqueue"
	"github.com/redlimit/redlimit/internal/lru"
	"github.com/redlimit/redlimit/internal/nodewatch"
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

// rescue holds a limiter's fallback state: its subscription to the watch
// of its client's Redis nodes (which are marked down, and the goroutines
// that probe them, shared by every limiter, Policy and Concurrency on the
// same client: see internal/nodewatch), the in-process stand-ins
// (fallback.go), and the transitions not yet reported to its hook.
type rescue struct {
	e      *engine
	w      *nodewatch.Watch
	locals *lru.Cache[*localSet]

	// answers is what Redis last said of each key (answers.go), with
	// FallbackLocal; else nil.
	answers *answers.Table

	// gone is set once the program has closed the Redis client.
	gone atomic.Bool

	// hook holds the transitions not yet reported to WithOnTransition's
	// hook; Close closes it.
	hook hookqueue.Queue[Transition]
}

// probeScript checks what a decision needs: the server's clock, and a write
// (which a replica, a full memory, a loading or a down slot refuses).
var probeScript = redis.NewScript(`redis.call('TIME') redis.call('SET', KEYS[1], '1', 'PX', 1000) return 1`)

// clientClockProbe is probeScript for a limiter with WithClientClock, whose
// decisions never call TIME in a script: the servers it is for refuse that,
// and would refuse every probe. (Its clock reads the plain TIME command,
// again after an outage: a decision that cannot get it fails as any
// other.) Limiters share a node watch by client and probe: one that calls
// TIME fails on the servers that WithClientClock is for, and one that does
// not cannot tell a server-clock limiter that TIME works.
var clientClockProbe = redis.NewScript(`redis.call('SET', KEYS[1], '1', 'PX', 1000) return 1`)

// probeSuffix ends every probe key (see nodewatch.ProbeSuffix).
const probeSuffix = nodewatch.ProbeSuffix

// newRescue makes e's fallback state and joins the node watch of e's
// client. A node that the watch has marked down already is reported to
// e's hook (see engine.startRescue).
func newRescue(e *engine) *rescue {
	r := &rescue{
		e:      e,
		locals: lru.NewWeighed(e.cfg.localKeys, standIns),
	}
	if e.cfg.fallback == FallbackLocal {
		r.answers = newAnswers(e.cfg.localKeys)
	}
	probe := probeScript
	if e.cfg.clientClock {
		probe = clientClockProbe
	}
	r.w = nodewatch.Join(nodewatch.Key{Client: e.rdb, Probe: probe}, r)
	return r
}

// anyDown reports whether any node is marked down.
func (r *rescue) anyDown() bool { return r.w.AnyDown() }

// isDown reports whether calls for the state key state go to the fallback:
// whether the node the client sends it to is marked down.
func (r *rescue) isDown(state string) bool { return r.w.IsDown(state) }

// downCause returns the error that marked state's node down, if it is.
func (r *rescue) downCause(state string) error { return r.w.Cause(state) }

// outage reports whether err, met by a call for the state key state, is to
// be answered by the fallback, and has the watch mark its node down or
// probe it (see nodewatch.Watch.Outage).
func (r *rescue) outage(err error, state string) bool {
	return r.w.Outage(r.e.cfg.prefix, state, err)
}

func (r *rescue) strategy() Strategy { return r.e.own.rules[0].alg.strategy }

// Interval is r's ping interval, for the watch (nodewatch.Sub).
func (r *rescue) Interval() time.Duration { return r.e.cfg.pingInterval }

// Queue queues the watch's switch e for r's hook (nodewatch.Sub). A node
// back may have come back on another machine: the client clock, if any,
// is measured again.
func (r *rescue) Queue(e nodewatch.Event) {
	t := Transition{Kind: TransitionBack, Strategy: r.strategy(), Node: e.Node, Down: e.Down, Err: e.Err, Outage: e.Outage}
	if e.Down {
		t.Kind = TransitionDown
	} else if c := r.e.clock; c != nil {
		c.Stale()
	}
	r.hook.Add(t)
}

// Gone records that the program closed the Redis client (nodewatch.Sub).
func (r *rescue) Gone() { r.gone.Store(true) }

// Flush reports the queued transitions to r's hook in order, with no lock
// held, so that it may call the limiter, Close included (nodewatch.Sub).
func (r *rescue) Flush() { r.hook.Flush(r.e.cfg.onTransition) }

// close takes r off its watch (the last limiter to leave stops the probes
// and waits for them) and drops the switches not reported yet.
func (r *rescue) close() {
	r.hook.Close()
	r.w.Leave(r)
}
