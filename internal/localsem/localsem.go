// Package localsem is a concurrency limit's semaphore for one key in this
// process, which its fallback uses while Redis is unavailable: at most
// capacity leases live at once, each expiring ttl after it was taken or
// last extended, with no goroutine (expired leases are pruned as the
// semaphore is used).
package localsem

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Held is the leases of the key held elsewhere that take slots of the
// semaphore too (a process's leases in Redis, during an outage): how many,
// and the earliest and latest expiry when N > 0.
type Held struct {
	N           int
	First, Last time.Time
}

// Answer is what Acquire says of a call.
type Answer struct {
	Allowed    bool
	Remaining  int           // allowed: the slots left
	RetryAfter time.Duration // denied: until the first lease expires
	ResetAfter time.Duration // until every lease has expired
	ByPriority bool          // denied only by the slots kept for the priority share
}

// Sem is the semaphore of one key: its leases in order of
// expiry, which is the order of their ids. Every lease lives ttl from its
// acquire or last extend, on the monotonic clock, so a new or extended
// lease (given a new id) always goes last and the expired ones are at the
// front. A released lease stays in place, marked, until it reaches the
// front or the marked ones are as many as the others; so a lease costs 32
// bytes, and a semaphore of one lease about 100.
type Sem struct {
	mu     sync.Mutex
	cap    int
	next   uint64
	leases []lease // earliest expiry first; released ones marked
	live   int     // leases not released (those expired included, until pruned)
	// dead: retired (it held no live lease): it takes no lease any more,
	// another semaphore serves its key.
	dead bool
}

// lease is one lease of a Sem; a zero exp marks it released.
type lease struct {
	id  uint64
	exp time.Time
}

// New returns the semaphore of a key with capacity slots.
func New(capacity int) *Sem {
	return &Sem{cap: capacity}
}

// pruneLocked drops the leases that expired by now, and the released ones
// before them.
func (s *Sem) pruneLocked(now time.Time) {
	i := 0
	for ; i < len(s.leases); i++ {
		ll := &s.leases[i]
		if !ll.exp.IsZero() {
			if now.Before(ll.exp) {
				break
			}
			s.live--
		}
	}
	if i > 0 {
		clear(s.leases[:i])
		s.leases = s.leases[i:]
	}
}

// findLocked returns the index of the lease id in s.leases, or -1.
func (s *Sem) findLocked(id uint64) int {
	i, ok := slices.BinarySearchFunc(s.leases, id, func(ll lease, id uint64) int { return cmp.Compare(ll.id, id) })
	if !ok || s.leases[i].exp.IsZero() {
		return -1
	}
	return i
}

// dropLocked marks the lease at i released, drops the released ones at
// the back, and compacts the leases once the marked ones are as many as
// the others.
func (s *Sem) dropLocked(i int) {
	s.leases[i].exp = time.Time{}
	s.live--
	n := len(s.leases)
	for n > 0 && s.leases[n-1].exp.IsZero() {
		n--
	}
	clear(s.leases[n:])
	s.leases = s.leases[:n]
	if len(s.leases) > 2*s.live+8 {
		kept := s.leases[:0]
		for _, ll := range s.leases {
			if !ll.exp.IsZero() {
				kept = append(kept, ll)
			}
		}
		clear(s.leases[len(kept):])
		s.leases = kept
	}
}

// boundsLocked returns the first and last expiry of the live leases;
// s.leases is pruned and holds a live one.
func (s *Sem) boundsLocked() (first, last time.Time) {
	return s.leases[0].exp, s.leases[len(s.leases)-1].exp
}

// Acquire takes a lease of ttl if one is free, and returns its id. The
// leases of held take slots too. capacity is the key's capacity now
// (it may change; leases beyond it stay until released). kept slots are
// left out for the call's priority share; a denial that only they make has
// ByPriority set (its RetryAfter is still the first expiry: a hint). ok is
// false, and nothing is done, when s was retired meanwhile: the caller
// takes the key's new one.
func (s *Sem) Acquire(now time.Time, ttl time.Duration, held Held, capacity, kept int) (id uint64, a Answer, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return 0, Answer{}, false
	}
	s.cap = capacity
	s.pruneLocked(now)
	if used := s.live + held.N; used >= s.cap-kept {
		first, last := held.First, held.Last
		if s.live > 0 {
			f, b := s.boundsLocked()
			if held.N == 0 || f.Before(first) {
				first = f
			}
			if held.N == 0 || b.After(last) {
				last = b
			}
		}
		return 0, Answer{RetryAfter: first.Sub(now), ResetAfter: last.Sub(now), ByPriority: used < s.cap}, true
	}
	s.next++
	s.leases = append(s.leases, lease{id: s.next, exp: now.Add(ttl)})
	s.live++
	return s.next, Answer{Allowed: true, Remaining: s.cap - kept - s.live - held.N, ResetAfter: ttl}, true
}

// Retire marks s dead if it holds no live lease at now, and reports
// whether it did; else it returns the last expiry of its leases. Its owner
// calls it before it drops s (a map, its shard locked).
func (s *Sem) Retire(now time.Time) (dead bool, last time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(now)
	if s.live == 0 {
		s.dead = true
		return true, time.Time{}
	}
	_, last = s.boundsLocked()
	return false, last
}

// Release gives back the lease *id, if it is still held; it reports
// whether s holds no lease left. *id is read under s's lock.
func (s *Sem) Release(id *uint64) (empty bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.findLocked(*id); i >= 0 {
		s.dropLocked(i)
	}
	return s.live == 0
}

// Extend renews the lease *id for ttl from now, under a new id that it
// writes to *id (under s's lock); false when it is not live.
func (s *Sem) Extend(id *uint64, now time.Time, ttl time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneLocked(now)
	i := s.findLocked(*id)
	if i < 0 {
		return false
	}
	s.dropLocked(i)
	s.next++
	s.leases = append(s.leases, lease{id: s.next, exp: now.Add(ttl)})
	s.live++
	*id = s.next
	return true
}

// Live returns how many leases s holds, the expired ones included until
// they are pruned.
func (s *Sem) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live
}

// Dead reports whether s was retired.
func (s *Sem) Dead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}
