// Package denycache remembers denials by key until they end, so that a
// limiter can deny a call again without a round trip to Redis.
//
// A [Cache] holds, per key, the last denial remembered: the caller's value
// (V: what Redis answered), the n that was denied and sig, the limits that
// denied it. A denial is for that n under those limits only: a call for
// fewer events may be allowed sooner, one for more later, one under other
// limits is another question; so [Cache.Lookup] finds it only for the
// same n and sig, until the time it was remembered for, and says how long
// ago it was remembered, for the caller to count its own times down.
//
// [Cache.Forget] drops a key, and fences every denial still in flight:
// [Cache.Remember] keeps one only if no Forget came since the
// [Cache.Epoch] read before its call was sent.
//
// A Cache holds about the size it was made with. When a shard is full, a
// few entries are looked at (in the map's random order) and the expired
// ones dropped, or else the first one (which only costs a round trip):
// constant work per insert. A Cache is safe for concurrent use; Lookup
// allocates nothing, nor does Remember but for a map's growth.
package denycache

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// shards is the number of shards a Cache splits its keys over.
const shards = 16

// Cache remembers, per key, a denial of type V (see the package doc).
// Make one with [New].
type Cache[V any] struct {
	seed   maphash.Seed
	shards [shards]shard[V]
	// epoch counts Forgets. A denial is remembered only if no Forget came
	// since its call was sent, so that a denial in flight during a Reset
	// cannot outlive it.
	epoch atomic.Uint64
}

type shard[V any] struct {
	mu    sync.RWMutex
	max   int
	until map[string]denial[V]
}

type denial[V any] struct {
	at    int64  // ns since epoch0 (monotonic): remembered
	until int64  // the same: the entry ends
	n     int    // the n that was denied
	sig   uint64 // the limits that denied it
	v     V
}

// epoch0 anchors the monotonic clock the cache compares against.
var epoch0 = time.Now()

func monoNow() int64 { return int64(time.Since(epoch0)) }

// New returns a Cache of about size keys (at least one a shard).
func New[V any](size int) *Cache[V] {
	c := &Cache[V]{seed: maphash.MakeSeed()}
	per := max(size/shards, 1)
	for i := range c.shards {
		c.shards[i].max = per
		c.shards[i].until = make(map[string]denial[V])
	}
	return c
}

func (c *Cache[V]) shard(key string) *shard[V] {
	return &c.shards[maphash.String(c.seed, key)%shards]
}

// Lookup returns the denial v remembered for n events of key under the
// limits sig, if it still holds, and age, how long ago it was remembered
// (less than the time it was remembered for).
func (c *Cache[V]) Lookup(key string, n int, sig uint64) (v V, age time.Duration, ok bool) {
	s := c.shard(key)
	s.mu.RLock()
	d, ok := s.until[key]
	s.mu.RUnlock()
	if !ok || n != d.n || sig != d.sig {
		return v, 0, false
	}
	now := monoNow()
	if d.until <= now {
		return v, 0, false
	}
	return d.v, time.Duration(now - d.at), true
}

// Epoch returns the count of Forgets so far: read it before sending a
// call whose denial may be remembered.
func (c *Cache[V]) Epoch() uint64 { return c.epoch.Load() }

// Remember records v, a denial of n events for key under the limits sig,
// for d from now, unless d is not positive or a Forget came after epoch
// (see Epoch).
func (c *Cache[V]) Remember(key string, n int, sig uint64, v V, d time.Duration, epoch uint64) {
	if d <= 0 {
		return
	}
	now := monoNow()
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.epoch.Load() != epoch {
		return
	}
	if _, ok := s.until[key]; !ok && len(s.until) >= s.max {
		looked := 0
		for k, old := range s.until {
			if old.until <= now {
				delete(s.until, k)
			}
			if looked++; looked == 8 {
				break
			}
		}
		for k := range s.until {
			if len(s.until) < s.max {
				break
			}
			delete(s.until, k)
		}
	}
	s.until[key] = denial[V]{at: now, until: now + int64(d), n: n, sig: sig, v: v}
}

// Forget drops key's denial, and any denial of any key still in flight
// (see Epoch).
func (c *Cache[V]) Forget(key string) {
	s := c.shard(key)
	s.mu.Lock()
	c.epoch.Add(1)
	delete(s.until, key)
	s.mu.Unlock()
}
