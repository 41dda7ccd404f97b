package redlimit

import (
	"container/list"
	"hash/maphash"
	"sync"
)

const lruShards = 16

// lru is a map from string keys to values that holds at most about max
// entries, dropping the least recently used. It is split into shards, each
// with its own lock, so goroutines working on different keys rarely wait
// for each other. Looking up an existing key allocates nothing.
type lru[V any] struct {
	seed   maphash.Seed
	shards [lruShards]lruShard[V]
}

type lruShard[V any] struct {
	mu    sync.Mutex
	max   int
	items map[string]*list.Element
	order list.List // front: most recently used; values are *lruItem[V]
}

type lruItem[V any] struct {
	key   string
	value V
}

func newLRU[V any](max int) *lru[V] {
	c := &lru[V]{seed: maphash.MakeSeed()}
	per := max / lruShards
	if per < 1 {
		per = 1
	}
	for i := range c.shards {
		c.shards[i].max = per
		c.shards[i].items = make(map[string]*list.Element)
	}
	return c
}

func (c *lru[V]) shard(key string) *lruShard[V] {
	return &c.shards[maphash.String(c.seed, key)%lruShards]
}

// getOrAdd returns key's value, adding the one make returns when key is
// missing. make runs with the shard locked; it must be quick.
func (c *lru[V]) getOrAdd(key string, make func() V) V {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.items[key]; ok {
		s.order.MoveToFront(e)
		return e.Value.(*lruItem[V]).value
	}
	if s.order.Len() >= s.max {
		oldest := s.order.Back()
		s.order.Remove(oldest)
		delete(s.items, oldest.Value.(*lruItem[V]).key)
	}
	v := make()
	s.items[key] = s.order.PushFront(&lruItem[V]{key: key, value: v})
	return v
}

// remove forgets key.
func (c *lru[V]) remove(key string) {
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.items[key]; ok {
		s.order.Remove(e)
		delete(s.items, key)
	}
}

// clear forgets every key.
func (c *lru[V]) clear() {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		clear(s.items)
		s.order.Init()
		s.mu.Unlock()
	}
}

// len returns the number of keys held.
func (c *lru[V]) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.items)
		s.mu.Unlock()
	}
	return n
}
