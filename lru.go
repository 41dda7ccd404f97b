package redlimit

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

const lruShards = 16

// lru is a map from string keys to values that holds at most about max
// entries. When a shard is full, the entry to drop is chosen by the
// second-chance (CLOCK) rule, which approximates least-recently-used: each
// entry has a flag that a lookup sets; the sweep skips (and clears) flagged
// entries and drops the first unflagged one. Lookups take only a read lock
// and set the flag atomically, so goroutines on the same key do not
// serialise on the map; looking up an existing key allocates nothing.
type lru[V any] struct {
	seed   maphash.Seed
	shards [lruShards]lruShard[V]
}

type lruShard[V any] struct {
	mu    sync.RWMutex
	max   int
	items map[string]*lruEntry[V]
	ring  []*lruEntry[V] // insertion order; hand points at the next candidate
	hand  int
}

type lruEntry[V any] struct {
	key   string
	value V
	used  atomic.Bool
}

func newLRU[V any](max int) *lru[V] {
	c := &lru[V]{seed: maphash.MakeSeed()}
	per := max / lruShards
	if per < 1 {
		per = 1
	}
	for i := range c.shards {
		c.shards[i].max = per
		c.shards[i].items = make(map[string]*lruEntry[V])
	}
	return c
}

func (c *lru[V]) shard(key string) *lruShard[V] {
	return &c.shards[maphash.String(c.seed, key)%lruShards]
}

// getOrAdd returns key's value, adding the one make returns when key is
// missing. make runs with the shard locked; it must be quick.
func (c *lru[V]) getOrAdd(key string, make func() V) V {
	v, _ := c.getOrAddKeep(key, make, nil)
	return v
}

// getOrAddKeep is getOrAdd that never drops an entry whose value keep
// reports true (keep runs with the shard locked; nil keeps none): when
// every entry of a full shard is kept, key is not added, and ok is false.
func (c *lru[V]) getOrAddKeep(key string, make func() V, keep func(V) bool) (v V, ok bool) {
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
	e = &lruEntry[V]{key: key, value: make()}
	if len(s.ring) < s.max {
		s.ring = append(s.ring, e)
	} else if !s.evictLocked(e, keep) {
		return v, false
	}
	s.items[key] = e
	return e.value, true
}

// evictLocked replaces with e the entry under the clock hand that was not
// used since the hand last passed it and that keep does not keep. After
// twice round the ring (lookups can flag entries again meanwhile), it
// replaces the first that keep does not keep, used or not; it reports
// false, and replaces none, only when keep keeps every entry.
func (s *lruShard[V]) evictLocked(e *lruEntry[V], keep func(V) bool) bool {
	n := len(s.ring)
	for i := range 3 * n {
		old := s.ring[s.hand]
		if old == nil || ((i >= 2*n || !old.used.Swap(false)) && (keep == nil || !keep(old.value))) {
			if old != nil {
				delete(s.items, old.key)
			}
			s.ring[s.hand] = e
			s.hand = (s.hand + 1) % n
			return true
		}
		s.hand = (s.hand + 1) % n
	}
	return false
}

// remove forgets key. Its ring slot is left empty, to be reused first.
func (c *lru[V]) remove(key string) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.items[key]
	if !ok {
		return
	}
	delete(s.items, key)
	for i, r := range s.ring {
		if r == e {
			s.ring[i] = nil
			s.hand = i
			return
		}
	}
}

// len returns the number of keys held.
func (c *lru[V]) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.items)
		s.mu.RUnlock()
	}
	return n
}
