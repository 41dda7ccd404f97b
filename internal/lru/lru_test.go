package lru

import (
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLRUBoundAndSecondChance(t *testing.T) {
	c := New[int](Shards * 4) // 4 per shard
	made := 0
	mk := func() int { made++; return made }
	hot := "hot"
	first := c.GetOrAdd(hot, mk)
	for i := range 1000 {
		c.GetOrAdd(hot, mk) // used between every insert: never evicted
		c.GetOrAdd("k"+strconv.Itoa(i), mk)
	}
	require.LessOrEqual(t, c.Len(), Shards*4, "keys held")
	require.Equal(t, first, c.GetOrAdd(hot, mk), "the hot key was evicted and made again")
	c.Remove(hot)
	require.NotEqual(t, first, c.GetOrAdd(hot, mk), "remove did not forget the key")
	require.LessOrEqual(t, c.Len(), Shards*4, "keys held after remove and add")
}

func TestLRUConcurrent(t *testing.T) {
	c := New[*int](64)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				k := strconv.Itoa((g*7 + i) % 300)
				assert.NotNil(t, c.GetOrAdd(k, func() *int { x := i; return &x }), "value of %s", k)
				if i%50 == 0 {
					c.Remove(k)
				}
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, c.Len(), 64, "keys held")
}

// Eviction never gives up while an entry can go: lookups that flag entries
// again during the sweep (here, keep does it for them) only delay it to the
// third time round, when the first entry keep does not keep goes, used or
// not (after two, getOrAdd returned no value: a nil deref in its callers).
func TestLRUEvictionGoesOn(t *testing.T) {
	kept := &lruEntry[int]{key: "kept", value: 1, weight: 1}
	other := &lruEntry[int]{key: "other", value: 2, weight: 1, at: 1}
	s := &lruShard[int]{max: 2, weight: 2, items: map[string]*lruEntry[int]{"kept": kept, "other": other}, ring: []*lruEntry[int]{kept, other}}
	keep := func(v int) bool {
		other.used.Store(true) // a reader, between the hand's steps
		return v == 1
	}
	require.True(t, s.evictLocked(keep, nil), "an entry keep does not keep was there to go")
	assert.Equal(t, []*lruEntry[int]{kept, nil}, s.ring)
	assert.Equal(t, []int{1}, s.free, "the empty slot, to fill first")
	assert.NotContains(t, s.items, "other")
	assert.Equal(t, 1, s.weight)

	all := func(int) bool { return true }
	assert.False(t, s.evictLocked(all, nil), "every entry kept")
	assert.False(t, s.evictLocked(nil, kept), "the only entry spared")
	assert.Equal(t, []*lruEntry[int]{kept, nil}, s.ring, "nothing dropped")
}

// A weighed LRU bounds the weight it holds, not its entries: entries of
// weight 4 in shards of 8 are two a shard, and an entry heavier than a
// shard is held alone. reweigh drops others when an entry grows, and
// remove gives its weight back.
func TestLRUWeighed(t *testing.T) {
	c := NewWeighed(Shards*8, func(w int) int { return w })
	for i := range 1000 {
		c.GetOrAdd("k"+strconv.Itoa(i), func() int { return 4 })
	}
	assert.Equal(t, Shards*8, c.Held(), "weight held")
	assert.Equal(t, Shards*2, c.Len(), "entries held")

	for i := range 1000 {
		c.GetOrAdd("heavy"+strconv.Itoa(i), func() int { return 20 })
	}
	assert.Equal(t, Shards*20, c.Held(), "weight held: one entry of 20 a shard")
	assert.Equal(t, Shards, c.Len(), "entries held")
	for i := range Shards {
		s := &c.shards[i]
		assert.Len(t, s.items, 1, "shard %d", i)
		assert.Equal(t, 20, s.weight, "shard %d", i)
	}

	d := NewWeighed(Shards*8, func(w *int) int { return *w })
	var vs []*int
	var keys []string
	for i := 0; len(keys) < 8; i++ { // 8 keys of weight 1 in one shard
		k := "k" + strconv.Itoa(i)
		if d.shard(k) != &d.shards[0] {
			continue
		}
		v := 1
		require.Same(t, &v, d.GetOrAdd(k, func() *int { return &v }))
		vs, keys = append(vs, &v), append(keys, k)
	}
	*vs[0] = 5
	d.Reweigh(keys[0])
	assert.LessOrEqual(t, d.shards[0].weight, 8, "weight held after one grew")
	assert.Equal(t, 4, d.Len(), "entries held: the grown one and 3 of weight 1")
	assert.Same(t, vs[0], d.GetOrAdd(keys[0], func() *int { t.Fatal("the grown entry was dropped"); return nil }))
	*vs[0] = 50
	d.Reweigh(keys[0])
	assert.Equal(t, 1, d.Len(), "the grown entry alone")
	assert.Equal(t, 50, d.Held())
	d.Remove(keys[0])
	assert.Equal(t, 0, d.Held(), "weight after remove")
	assert.Equal(t, 0, d.Len())
}

// An add into a shard full of entries keep keeps looks at KeepScan of them,
// not at every one, and is refused; the hand goes on, so that an entry keep
// lets go is found by a later add, and dropped whether used lately or not.
func TestLRUKeepScanBounded(t *testing.T) {
	c := New[int](Shards * 100) // 100 a shard
	// keys returns n keys of shard 0.
	keys := func(n int) []string {
		var ks []string
		for i := 0; len(ks) < n; i++ {
			if k := "k" + strconv.Itoa(i); c.shard(k) == &c.shards[0] {
				ks = append(ks, k)
			}
		}
		return ks
	}
	ks := keys(101)
	for i, k := range ks[:100] {
		c.GetOrAdd(k, func() int { return i })
	}
	calls := 0
	free := -1 // the value keep lets go
	keep := func(v int) bool { calls++; return v != free }
	_, ok := c.GetOrAddKeep(ks[100], func() int { return 100 }, keep)
	assert.False(t, ok, "every entry kept")
	assert.Equal(t, KeepScan, calls, "entries looked at")

	// The last of the ring, 99 - 32 entries past the hand, used lately.
	free = 99
	c.GetOrAdd(ks[99], func() int { return 0 })
	added := 0
	for range 100 / KeepScan {
		if _, ok := c.GetOrAddKeep(ks[100], func() int { return 100 }, keep); ok {
			added++
		}
	}
	assert.Equal(t, 1, added, "the entry let go was found, used lately or not")
	_, held := c.shards[0].items[ks[99]]
	assert.False(t, held, "the entry let go was dropped")
	assert.Equal(t, 100, len(c.shards[0].items))
}

// RemoveIf forgets a key only if its value says so, Remove always, in O(1)
// (the entry knows its ring slot, which later adds reuse); Sweep forgets
// what drop says, and makes a shard it emptied small again.
func TestLRURemoveIfSweep(t *testing.T) {
	c := New[int](Shards * 1000)
	for i := range 5000 {
		c.GetOrAdd("k"+strconv.Itoa(i), func() int { return i })
	}
	assert.False(t, c.RemoveIf("k1", func(v int) bool { return v != 1 }))
	assert.True(t, c.RemoveIf("k1", func(v int) bool { return v == 1 }))
	assert.False(t, c.RemoveIf("k1", nil), "already gone")
	c.Remove("k2")
	assert.Equal(t, 4998, c.Len())
	for i := range 5000 { // every entry sits in the ring slot it knows
		s := c.shard("k" + strconv.Itoa(i))
		s.mu.RLock()
		if e, ok := s.items["k"+strconv.Itoa(i)]; ok {
			assert.Same(t, e, s.ring[e.at], "k%d", i)
		}
		s.mu.RUnlock()
	}
	c.GetOrAdd("k1", func() int { return -1 }) // into a freed slot
	assert.Equal(t, -1, c.GetOrAdd("k1", func() int { return 0 }))

	left := c.Sweep(func(v int) bool { return v%100 != 0 })
	assert.Equal(t, 50, left, "the multiples of 100 kept") // k0 … k4900
	assert.Equal(t, 50, c.Len())
	for i := range c.shards {
		s := &c.shards[i]
		assert.Equal(t, len(s.items), len(s.ring), "shard %d made small again", i)
		assert.Empty(t, s.free)
		for _, e := range s.ring {
			assert.Same(t, e, s.ring[e.at])
			assert.Zero(t, e.value%100)
		}
	}
	c.Remove("k4900")
	assert.Equal(t, 49, c.Len())
	assert.Zero(t, c.Sweep(func(int) bool { return true }))
	assert.Zero(t, c.Held())
}
