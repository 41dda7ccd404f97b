package localsem

import (
	"container/list"
	"sync"
	"sync/atomic"
	"time"
)

// Held is the Redis leases a process holds that are live by their ttl on
// its clock, by key: while Redis is unavailable they take slots of the
// key's [Sem]. A lease's expiry is counted from the reply that granted or
// extended it, so a little later than in Redis. Expired leases are pruned
// when their key is used, and every key's when the map has grown to twice
// its size after the last sweep; so it holds about the live leases only.
// The methods of a nil Held do nothing (At returns no lease).
type Held struct {
	now func() time.Time
	ttl time.Duration

	mu      sync.Mutex
	byKey   map[string]*list.List // *Entry, earliest expiry first
	sweepAt int                   // len(byKey) at which every key is pruned
}

// Entry is one lease in a [Held], kept by the caller's lease value: its
// key, its expiry on the process's clock and its place, under the Held's
// lock; its place is nil once removed or expired.
type Entry struct {
	key  string
	exp  time.Time
	elem *list.Element
}

// minSweep is the fewest keys a Held keeps before it sweeps.
const minSweep = 64

// NewHeld returns a Held of leases that live ttl on the clock now.
func NewHeld(now func() time.Time, ttl time.Duration) *Held {
	return &Held{now: now, ttl: ttl, byKey: make(map[string]*list.List), sweepAt: minSweep}
}

// Add counts e, a lease of key that Redis has just granted, from now.
func (h *Held) Add(e *Entry, key string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	e.key = key
	h.pushLocked(e, now)
	if len(h.byKey) >= h.sweepAt {
		for k, ls := range h.byKey {
			if prune(ls, now) == 0 {
				delete(h.byKey, k)
			}
		}
		h.sweepAt = max(2*len(h.byKey), minSweep)
	}
}

func (h *Held) pushLocked(e *Entry, now time.Time) {
	ls := h.byKey[e.key]
	if ls == nil {
		ls = list.New()
		h.byKey[e.key] = ls
	}
	e.exp = now.Add(h.ttl)
	e.elem = ls.PushBack(e)
	prune(ls, now)
}

// Extend counts e, which Redis has just extended, from now again, unless
// released is set: the lease was released meanwhile (it is read under the
// lock that [Held.Remove] takes, so a release that removes e first is never
// undone).
func (h *Held) Extend(e *Entry, released *atomic.Bool) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if released.Load() {
		return
	}
	h.removeLocked(e)
	h.pushLocked(e, h.now())
}

// Remove stops counting e: released, or expired in Redis.
func (h *Held) Remove(e *Entry) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.removeLocked(e)
}

func (h *Held) removeLocked(e *Entry) {
	if e.elem == nil {
		return
	}
	ls := h.byKey[e.key]
	ls.Remove(e.elem)
	e.elem = nil
	if ls.Len() == 0 {
		delete(h.byKey, e.key)
	}
}

// At returns the live leases of key at now.
func (h *Held) At(key string, now time.Time) Count {
	if h == nil {
		return Count{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	ls := h.byKey[key]
	if ls == nil {
		return Count{}
	}
	if prune(ls, now) == 0 {
		delete(h.byKey, key)
		return Count{}
	}
	return Count{N: ls.Len(), First: ls.Front().Value.(*Entry).exp, Last: ls.Back().Value.(*Entry).exp}
}

// prune drops the leases of ls that expired by now, and returns how many
// are left. Every lease lives ttl from its latest add or extend, so the
// expired ones are at the front.
func prune(ls *list.List, now time.Time) int {
	for el := ls.Front(); el != nil; el = ls.Front() {
		e := el.Value.(*Entry)
		if now.Before(e.exp) {
			break
		}
		ls.Remove(el)
		e.elem = nil
	}
	return ls.Len()
}

// keys returns how many keys h holds leases of (for tests).
func (h *Held) keys() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byKey)
}
