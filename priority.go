package redlimit

import (
	"context"
	"math"
	"strconv"
)

// Priority says how important a call is when its limit is near. With
// [WithPriorityShares], calls of the lower priorities may use only a share
// of each limit, so that the rest stays for the critical ones; without it,
// a call's priority is ignored. Put it on a call's context with
// [ContextWithPriority].
type Priority int

// The priorities, from the first shed to the last.
const (
	Sheddable Priority = iota + 1 // shed first: batch work, prefetches, retries
	Normal                        // a call with no priority
	Critical                      // shed last: logins, payments, health checks
)

// String returns "sheddable", "normal" or "critical".
func (p Priority) String() string {
	switch p {
	case Sheddable:
		return "sheddable"
	case Normal:
		return "normal"
	case Critical:
		return "critical"
	}
	return "Priority(" + strconv.Itoa(int(p)) + ")"
}

type priorityKey struct{}

// ContextWithPriority returns a copy of ctx whose calls are decided at p.
// A p other than Sheddable, Normal or Critical is decided as Normal.
func ContextWithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityFromContext returns the priority of ctx, Normal when it has none.
func PriorityFromContext(ctx context.Context) Priority {
	if ctx != nil {
		if p, ok := ctx.Value(priorityKey{}).(Priority); ok && p >= Sheddable && p <= Critical {
			return p
		}
	}
	return Normal
}

// shareScale is the unit of a priority's share as the scripts take it:
// parts per million, so that floor(share × capacity) is exact integer
// arithmetic on both sides (as a float64, 0.29 × 100 is 28.999…).
const shareScale = 1_000_000

// priorityShares is WithPriorityShares's config: the shares of Sheddable
// and Normal calls, in parts per million (shareScale).
type priorityShares struct {
	on                bool
	sheddable, normal float64
	ppm               [Critical + 1]int64 // by Priority; 0 for Critical (all)
}

// callShare returns the share of each limit that a call with ctx may use,
// in parts per million, and its priority; 0 when it may use all (no
// WithPriorityShares, a Critical call, or a share of 1).
func (e *engine) callShare(ctx context.Context) (int64, Priority) {
	if !e.cfg.priority.on {
		return 0, Normal
	}
	p := PriorityFromContext(ctx)
	return e.cfg.priority.ppm[p], p
}

// shareOf returns floor(ppm × capacity / 1e6), exactly, as the scripts
// compute it: a capacity's part that a call with share ppm may use (ppm 0:
// all of it).
func shareOf(capacity int64, ppm int64) int64 {
	if ppm == 0 {
		return capacity
	}
	q, r := capacity/shareScale, capacity%shareScale
	return q*ppm + r*ppm/shareScale
}

// shareStage rejects a call that its priority share can never admit (see
// checkShare); the others go on.
func (e *engine) shareStage(r *request, next decider) error {
	if r.share != 0 && r.n > 0 {
		if err := e.checkShare(r.n, r.rs, r.share, r.prio); err != nil {
			return err
		}
	}
	return next(r)
}

// checkShare rejects a call of n events that its share of rs's rules can
// never admit at once (see checkCount): more than floor(share × capacity)
// of a rule that counts n and takes a share. A bucket with a warm-up takes
// none (its capacity is time, not events), in the scripts and in the
// fallback: it is left to them.
func (e *engine) checkShare(n int, rs *ruleSet, ppm int64, p Priority) error {
	for i := range rs.rules {
		r := &rs.rules[i]
		if r.alg.warm {
			continue
		}
		if c := shareOf(int64(r.capacity()), ppm); int64(r.count(n)) > c {
			return errorf("n = %d, but a %v call may use at most %d of %s %v: %w",
				n, p, c, r.alg.strategy, r.limit, ErrExceedsLimit)
		}
	}
	return nil
}

// sharePPM converts a share in (0, 1] to parts per million, rounded to the
// nearest; 0 for a share of 1 (all).
func sharePPM(share float64) int64 {
	ppm := int64(math.Round(share * shareScale))
	if ppm >= shareScale {
		return 0
	}
	return max(ppm, 1)
}
