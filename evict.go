package redlimit

import (
	"time"

	"github.com/redlimit/redlimit/internal/evictwatch"
)

// defaultEvictEvery is WithEvictionCheck's default interval.
const defaultEvictEvery = 10 * time.Second

// joinEvictWatch returns the eviction watch of e's client and interval
// (WithEvictionCheck; nil when off), which reports to e's OnTransition hook.
func joinEvictWatch(e *engine, every time.Duration) *evictwatch.Watch {
	return evictwatch.Join(e.rdb, every, e, func(rep evictwatch.Report) {
		e.rescue.notify(transition(e, rep))
	})
}

// transition is the report to e of a master that began to evict.
func transition(e *engine, rep evictwatch.Report) Transition {
	err := errorf("%s: %s: limiter keys it evicts come back with a full allowance: %w", e.kind, rep, ErrEvictionPolicy)
	return Transition{Kind: TransitionEvicted, Strategy: e.rescue.strategy(), Node: rep.Addr, Err: err, Evicted: rep.Rise}
}

// notify reports t through the OnTransition hook, after the switches
// queued before it, unless the limiter is closed.
func (r *rescue) notify(t Transition) {
	r.hook.Add(t)
	r.Flush()
}
