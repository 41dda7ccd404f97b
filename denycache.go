package redlimit

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/lru"
)

// denyCache remembers keys that Redis denied, until the RetryAfter it gave,
// so that calls for them within that time are denied without a round trip.
// RetryAfter is for the n that was denied under the limits that denied it:
// a call for fewer events may be allowed sooner and one for more later, and
// a call under other limits (WithLimitFunc) is another question, so an
// entry answers only calls for the same n under the same limits.
// Entries expire; when a shard is full, a few entries are looked at (in
// the map's random order) and the expired ones dropped, or else the first
// one (which only costs a round trip): constant work per insert.
type denyCache struct {
	seed   maphash.Seed
	shards [lru.Shards]denyShard
	// epoch counts Resets. A denial is remembered only if no Reset came
	// since its call was sent, so that a denial in flight during a Reset
	// cannot outlive it.
	epoch atomic.Uint64
}

type denyShard struct {
	mu    sync.RWMutex
	max   int
	until map[string]denial
}

type denial struct {
	until int64  // ns since epoch0 (monotonic): the entry ends
	retry int64  // the same, for Redis's RetryAfter (at or after until)
	reset int64  // the same, for ResetAfter
	own   int64  // the same, for RuleResetAfter
	n     int    // the n that was denied
	sig   uint64 // the limits that denied it
	res   Result // Redis's denial: its rule, limit and remaining
}

// epoch0 anchors the monotonic clock the cache compares against.
var epoch0 = time.Now()

func monoNow() int64 { return int64(time.Since(epoch0)) }

func newDenyCache(size int) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed()}
	per := max(size/lru.Shards, 1)
	for i := range c.shards {
		c.shards[i].max = per
		c.shards[i].until = make(map[string]denial)
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%lru.Shards]
}

// lookup returns a denial if n events for key under the limits sig are
// known to be denied now: Redis's, with its times counted down, so that
// the deciding rule, its limit and the reset it gave stay what Redis said.
func (c *denyCache) lookup(key string, n int, sig uint64) (Result, bool) {
	s := c.shard(key)
	s.mu.RLock()
	d, ok := s.until[key]
	s.mu.RUnlock()
	if !ok || n != d.n || sig != d.sig {
		return Result{}, false
	}
	now := monoNow()
	if d.until <= now {
		return Result{}, false
	}
	res := d.res
	res.RetryAfter = time.Duration(d.retry - now)
	res.ResetAfter = time.Duration(max(d.reset, d.retry) - now)
	res.RuleResetAfter = time.Duration(max(d.own, d.retry) - now)
	return res, true
}

// remember records Redis's denial res of n events for key under the
// limits sig, for d from now (at most its RetryAfter), unless a Reset came
// after epoch (read before the call).
func (c *denyCache) remember(key string, n int, sig uint64, res Result, d time.Duration, epoch uint64) {
	d = min(d, res.RetryAfter)
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
	s.until[key] = denial{until: now + int64(d), retry: now + int64(res.RetryAfter), reset: now + int64(res.ResetAfter), own: now + int64(res.RuleResetAfter), n: n, sig: sig, res: res}
}

// forget drops key, and any denial of any key still in flight.
func (c *denyCache) forget(key string) {
	s := c.shard(key)
	s.mu.Lock()
	c.epoch.Add(1)
	delete(s.until, key)
	s.mu.Unlock()
}
