package redlimit

import (
	"strconv"
	"sync"
	"testing"
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
	if got := c.len(); got > lruShards*4 {
		t.Fatalf("holds %d keys, want at most %d", got, lruShards*4)
	}
	if got := c.getOrAdd(hot, mk); got != first {
		t.Fatalf("the hot key was evicted and made again (%d, want %d)", got, first)
	}
	c.remove(hot)
	if got := c.getOrAdd(hot, mk); got == first {
		t.Fatal("remove did not forget the key")
	}
	if got := c.len(); got > lruShards*4 {
		t.Fatalf("holds %d keys after remove and add, want at most %d", got, lruShards*4)
	}
}

func TestLRUConcurrent(t *testing.T) {
	c := newLRU[*int](64)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				k := strconv.Itoa((g*7 + i) % 300)
				if v := c.getOrAdd(k, func() *int { x := i; return &x }); v == nil {
					t.Error("nil value")
				}
				if i%50 == 0 {
					c.remove(k)
				}
			}
		})
	}
	wg.Wait()
	if got := c.len(); got > 64 {
		t.Fatalf("holds %d keys, want at most 64", got)
	}
}
