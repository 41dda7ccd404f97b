package redlimit

import (
	"hash/maphash"
	"sync"
	"time"
)

// denyCache remembers keys that Redis denied, until the RetryAfter it gave,
// so that calls for them within that time are denied without a round trip.
// Entries expire; when a shard is full, expired entries are swept and, if
// none were, an arbitrary one is dropped (which only costs a round trip).
type denyCache struct {
	seed   maphash.Seed
	shards [lruShards]denyShard
}

type denyShard struct {
	mu    sync.RWMutex
	max   int
	until map[string]int64 // key -> deadline, ns since epoch0 (monotonic)
}

// epoch0 anchors the monotonic clock the cache compares against.
var epoch0 = time.Now()

func monoNow() int64 { return int64(time.Since(epoch0)) }

func newDenyCache(size int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed()}
	per := max(size/lruShards, 1)
	for i := range c.shards {
		c.shards[i].max = per
		c.shards[i].until = make(map[string]int64)
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%lruShards]
}

// lookup returns a denial if key is known to be denied now.
func (c *denyCache) lookup(key string, limit Limit) (Result, bool) {
	s := c.shard(key)
	s.mu.RLock()
	until, ok := s.until[key]
	s.mu.RUnlock()
	if !ok {
		return Result{}, false
	}
	left := until - monoNow()
	if left <= 0 {
		return Result{}, false
	}
	d := time.Duration(left)
	return Result{Limit: limit, RetryAfter: d, ResetAfter: d}, true
}

// remember records that key is denied for d from now.
func (c *denyCache) remember(key string, d time.Duration) {
	if d <= 0 {
		return
	}
	now := monoNow()
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.until[key]; !ok && len(s.until) >= s.max {
		for k, u := range s.until {
			if u <= now {
				delete(s.until, k)
			}
		}
		if len(s.until) >= s.max {
			for k := range s.until {
				delete(s.until, k)
				break
			}
		}
	}
	s.until[key] = now + int64(d)
}

// forget drops key.
func (c *denyCache) forget(key string) {
	s := c.shard(key)
	s.mu.Lock()
	delete(s.until, key)
	s.mu.Unlock()
}
