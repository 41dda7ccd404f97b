package redlimit

import (
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLRUBoundAndSecondChance(t *testing.T) {
	c := newLRU[int](lruShards * 4) // 4 per shard
	made := 0
	mk := func() int { made++; return made }
	hot := "hot"
	first := c.getOrAdd(hot, mk)
	for i := range 1000 {
		c.getOrAdd(hot, mk) // used between every insert: never evicted
		c.getOrAdd("k"+strconv.Itoa(i), mk)
	}
	require.LessOrEqual(t, c.len(), lruShards*4, "keys held")
	require.Equal(t, first, c.getOrAdd(hot, mk), "the hot key was evicted and made again")
	c.remove(hot)
	require.NotEqual(t, first, c.getOrAdd(hot, mk), "remove did not forget the key")
	require.LessOrEqual(t, c.len(), lruShards*4, "keys held after remove and add")
}

func TestLRUConcurrent(t *testing.T) {
	c := newLRU[*int](64)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				k := strconv.Itoa((g*7 + i) % 300)
				assert.NotNil(t, c.getOrAdd(k, func() *int { x := i; return &x }), "value of %s", k)
				if i%50 == 0 {
					c.remove(k)
				}
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, c.len(), 64, "keys held")
}

// Eviction never gives up while an entry can go: lookups that flag entries
// again during the sweep (here, keep does it for them) only delay it to the
// third time round, when the first entry keep does not keep goes, used or
// not (after two, getOrAdd returned no value: a nil deref in its callers).
func TestLRUEvictionGoesOn(t *testing.T) {
	kept := &lruEntry[int]{key: "kept", value: 1}
	other := &lruEntry[int]{key: "other", value: 2}
	s := &lruShard[int]{max: 2, items: map[string]*lruEntry[int]{"kept": kept, "other": other}, ring: []*lruEntry[int]{kept, other}}
	keep := func(v int) bool {
		other.used.Store(true) // a reader, between the hand's steps
		return v == 1
	}
	e := &lruEntry[int]{key: "new", value: 3}
	require.True(t, s.evictLocked(e, keep), "an entry keep does not keep was there to go")
	assert.Equal(t, []*lruEntry[int]{kept, e}, s.ring)
	assert.NotContains(t, s.items, "other")

	all := func(int) bool { return true }
	assert.False(t, s.evictLocked(&lruEntry[int]{key: "newer", value: 4}, all), "every entry kept")
	assert.Equal(t, []*lruEntry[int]{kept, e}, s.ring, "nothing replaced")
}
