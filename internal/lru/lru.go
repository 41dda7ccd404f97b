// Package lru is a sharded map of bounded weight whose entries are dropped
// by the CLOCK approximation of least recently used: the limiters keep
// their fallback stand-ins, semaphores and prefetches in it.
package lru

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// Shards is the number of shards a Cache splits its keys over; each holds
// at least one entry, whatever its weight.
const Shards = 16

// Cache is a map from string keys to values that holds at most about max
// weight: each entry weighs what the Cache's weigh function says of its
// value when it is added (1 without one), so that a bound can be one of
// memory, not only of entries. A shard that holds nothing takes an entry
// of any weight. When a shard is full, the entries to drop are chosen by
// the second-chance (CLOCK) rule, which approximates least-recently-used:
// each entry has a flag that a lookup sets; the sweep skips (and clears)
// flagged entries and drops the first unflagged one. Lookups take only a
// read lock and set the flag atomically, so goroutines on the same key do
// not serialise on the map; looking up an existing key allocates nothing.
type Cache[V any] struct {
	seed   maphash.Seed
	weigh  func(V) int // nil: every entry weighs 1
	shards [Shards]lruShard[V]
}

type lruShard[V any] struct {
	mu     sync.RWMutex
	max    int // the weight a shard holds at most
	weight int // the weight held
	items  map[string]*lruEntry[V]
	ring   []*lruEntry[V] // insertion order; hand points at the next candidate
	free   []int          // empty slots of ring, filled first
	hand   int
}

type lruEntry[V any] struct {
	key    string
	value  V
	used   atomic.Bool
	weight int32
	at     int // its slot in ring
}

// New returns a Cache that holds at most about maxEntries entries (at least one
// a shard).
func New[V any](maxEntries int) *Cache[V] {
	c := &Cache[V]{seed: maphash.MakeSeed()}
	per := maxEntries / Shards
	if per < 1 {
		per = 1
	}
	for i := range c.shards {
		c.shards[i].max = per
		c.shards[i].items = make(map[string]*lruEntry[V])
	}
	return c
}

// NewWeighed is New whose entries weigh what weigh says of their
// value (at least 1), and hold at most about maxWeight weight.
func NewWeighed[V any](maxWeight int, weigh func(V) int) *Cache[V] {
	c := New[V](maxWeight)
	c.weigh = weigh
	return c
}

func (c *Cache[V]) shard(key string) *lruShard[V] {
	return &c.shards[maphash.String(c.seed, key)%Shards]
}

// GetOrAdd returns key's value, adding the one newValue returns when key
// is missing. newValue runs with the shard locked; it must be quick.
func (c *Cache[V]) GetOrAdd(key string, newValue func() V) V {
	v, _ := c.GetOrAddKeep(key, newValue, nil)
	return v
}

// KeepScan is how many entries an add into a full shard looks at, at
// most, for one that GetOrAddKeep's keep lets go.
const KeepScan = 32

// GetOrAddKeep is GetOrAdd that never drops an entry whose value keep
// reports true (keep runs with the shard locked; nil keeps none). In a
// full shard, an add looks at up to KeepScan entries from the clock hand
// on, and drops the first that keep lets go, whether used lately or not
// (what keep lets go is worth nothing kept); when keep keeps all of them,
// key is not added, and ok is false. So an add into a shard full of kept
// entries costs KeepScan calls of keep, not one per entry, and the hand
// goes on from there: the next adds look at the next ones.
func (c *Cache[V]) GetOrAddKeep(key string, newValue func() V, keep func(V) bool) (v V, ok bool) {
	s := c.shard(key)
	s.mu.RLock()
	e, ok := s.items[key]
	s.mu.RUnlock()
	if ok {
		if !e.used.Load() {
			e.used.Store(true)
		}
		return e.value, true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.items[key]; ok {
		return e.value, true
	}
	e = &lruEntry[V]{key: key, value: newValue(), weight: 1}
	if c.weigh != nil {
		e.weight = int32(max(c.weigh(e.value), 1))
	}
	for s.weight > 0 && s.weight+int(e.weight) > s.max {
		if keep != nil {
			if !s.evictKeepLocked(keep) {
				return v, false
			}
		} else if !s.evictLocked(nil, nil) {
			return v, false
		}
	}
	if n := len(s.free); n > 0 {
		e.at = s.free[n-1]
		s.ring[e.at] = e
		s.free = s.free[:n-1]
	} else {
		e.at = len(s.ring)
		s.ring = append(s.ring, e)
	}
	s.weight += int(e.weight)
	s.items[key] = e
	return e.value, true
}

// evictKeepLocked drops the first of the next KeepScan entries under the
// clock hand that keep does not keep, and reports whether it dropped one.
func (s *lruShard[V]) evictKeepLocked(keep func(V) bool) bool {
	n := len(s.ring)
	for range min(n, KeepScan) {
		at := s.hand
		s.hand = (s.hand + 1) % n
		old := s.ring[at]
		if old == nil {
			continue
		}
		old.used.Store(false)
		if keep(old.value) {
			continue
		}
		s.dropLocked(old)
		return true
	}
	return false
}

// dropLocked forgets the entry e. Its ring slot is left empty, to be
// reused first.
func (s *lruShard[V]) dropLocked(e *lruEntry[V]) {
	delete(s.items, e.key)
	s.ring[e.at] = nil
	s.free = append(s.free, e.at)
	s.weight -= int(e.weight)
}

// evictLocked drops the entry under the clock hand that was not used since
// the hand last passed it and that keep does not keep (nor is spare).
// After twice round the ring (lookups can flag entries again meanwhile),
// it drops the first that keep does not keep, used or not; it reports
// false, and drops none, only when keep keeps every entry.
func (s *lruShard[V]) evictLocked(keep func(V) bool, spare *lruEntry[V]) bool {
	n := len(s.ring)
	for i := range 3 * n {
		at := s.hand
		s.hand = (s.hand + 1) % n
		old := s.ring[at]
		if old == nil || old == spare || (i < 2*n && old.used.Swap(false)) || (keep != nil && keep(old.value)) {
			continue
		}
		s.dropLocked(old)
		return true
	}
	return false
}

// Reweigh weighs key's entry again, if it is held, and drops others, as an
// add does, while its shard holds more than its bound (a value whose weight
// grew: a key given more rules).
func (c *Cache[V]) Reweigh(key string) {
	if c.weigh == nil {
		return
	}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.items[key]
	if !ok {
		return
	}
	w := int32(max(c.weigh(e.value), 1))
	s.weight += int(w - e.weight)
	e.weight = w
	for s.weight > s.max {
		if !s.evictLocked(nil, e) {
			return // e is alone
		}
	}
}

// Remove forgets key. Its ring slot is left empty, to be reused first.
func (c *Cache[V]) Remove(key string) {
	c.RemoveIf(key, nil)
}

// RemoveIf forgets key if drop, called with the shard locked, reports
// true of its value (a nil drop: always), and reports whether it did.
func (c *Cache[V]) RemoveIf(key string, drop func(V) bool) bool {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.items[key]
	if !ok || (drop != nil && !drop(e.value)) {
		return false
	}
	s.dropLocked(e)
	return true
}

// Sweep forgets every entry whose value drop reports true, one shard at a
// time (drop runs with the shard locked), and returns how many are left. A
// shard left with fewer than a quarter of the entries it had room for is
// made again at its size, so that the memory of what it forgot is freed.
func (c *Cache[V]) Sweep(drop func(V) bool) (left int) {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		for _, e := range s.ring {
			if e != nil && drop(e.value) {
				s.dropLocked(e)
			}
		}
		if 4*len(s.items) < len(s.ring) {
			s.compactLocked()
		}
		left += len(s.items)
		s.mu.Unlock()
	}
	return left
}

// compactLocked makes the shard's map and ring again, holding its entries
// only, in the ring's order.
func (s *lruShard[V]) compactLocked() {
	items := make(map[string]*lruEntry[V], len(s.items))
	var ring []*lruEntry[V]
	if len(s.items) > 0 {
		ring = make([]*lruEntry[V], 0, len(s.items))
	}
	for _, e := range s.ring {
		if e != nil {
			e.at = len(ring)
			ring = append(ring, e)
			items[e.key] = e
		}
	}
	s.items, s.ring, s.free, s.hand = items, ring, nil, 0
}

// Len returns the number of keys held.
func (c *Cache[V]) Len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.items)
		s.mu.RUnlock()
	}
	return n
}

// Held returns the weight held.
func (c *Cache[V]) Held() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += s.weight
		s.mu.RUnlock()
	}
	return n
}
