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
