// Package holdhint estimates how soon a concurrency slot frees, for the
// Retry-After of the concurrency middleware of this module (httplimit and
// grpclimit): from the hold times it observed, not from the lease ttl,
// which only bounds a crashed holder's. Only packages under
// github.com/redlimit/redlimit can import it; it is no part of the API.
package holdhint

import (
	"sync"
	"time"
)

// weight is the share of a new hold time in the moving average: 1/8, so
// the hint follows a change of load within a few dozen requests, and one
// slow request moves it by an eighth of its excess.
const weight = 8

// Hint is a moving average of hold times. Its zero value is not usable;
// call New. It is safe for concurrent use.
type Hint struct {
	def time.Duration

	mu  sync.Mutex
	avg time.Duration // 0 until the first hold
}

// New returns a Hint that answers def until it has observed a hold.
func New(def time.Duration) *Hint { return &Hint{def: def} }

// Observe adds a hold of d.
func (h *Hint) Observe(d time.Duration) {
	d = max(d, 0)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.avg == 0 {
		h.avg = max(d, 1)
		return
	}
	h.avg = max(h.avg+(d-h.avg)/weight, 1)
}

// RetryAfter returns the hint for a key of slots slots, all held: the
// average hold observed divided by slots (holders at random points of
// their holds free the first slot after about that long; one slot, after
// about the average hold), or the default before any hold was observed;
// never more than bound, when bound is positive (the oldest lease's
// expiry, by which a slot is free whatever the holders do).
func (h *Hint) RetryAfter(bound time.Duration, slots int) time.Duration {
	h.mu.Lock()
	d := h.avg
	h.mu.Unlock()
	if d == 0 {
		d = h.def
	} else {
		d = max(d/time.Duration(max(slots, 1)), 1)
	}
	if bound > 0 {
		d = min(d, bound)
	}
	return d
}
