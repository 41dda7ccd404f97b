package denycache

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A denial answers the same n under the same limits only, with its age.
func TestLookupSameCall(t *testing.T) {
	c := New[string](100)
	before := monoNow()
	c.Remember("k", 2, 7, "denied", time.Hour, c.Epoch())
	v, age, ok := c.Lookup("k", 2, 7)
	require.True(t, ok, "just remembered")
	assert.Equal(t, "denied", v)
	assert.GreaterOrEqual(t, age, time.Duration(0), "age")
	assert.LessOrEqual(t, age, time.Duration(monoNow()-before), "age, within the test's run")
	for _, miss := range []struct {
		name string
		key  string
		n    int
		sig  uint64
	}{
		{"another n", "k", 1, 7},
		{"a larger n", "k", 3, 7},
		{"other limits", "k", 2, 8},
		{"another key", "j", 2, 7},
	} {
		if v, _, ok := c.Lookup(miss.key, miss.n, miss.sig); ok {
			t.Errorf("%s: got %q, want no denial", miss.name, v)
		}
	}
}

// A denial ends when its time does; one remembered for no time is not.
func TestLookupEnds(t *testing.T) {
	c := New[int](100)
	c.Remember("k", 1, 0, 1, time.Nanosecond, c.Epoch())
	before := monoNow()
	for monoNow() == before { // the clock passes the nanosecond
		runtime.Gosched()
	}
	_, _, ok := c.Lookup("k", 1, 0)
	assert.False(t, ok, "after its time")
	c.Remember("zero", 1, 0, 1, 0, c.Epoch())
	c.Remember("negative", 1, 0, 1, -time.Second, c.Epoch())
	for _, key := range []string{"zero", "negative"} {
		_, _, ok := c.Lookup(key, 1, 0)
		assert.False(t, ok, "%s: remembered for no time", key)
	}
}

// Forget drops the key, and a denial whose call was sent before it (any
// key's: the epoch read before) is not remembered.
func TestForgetFencesInFlight(t *testing.T) {
	c := New[int](100)
	c.Remember("k", 1, 0, 1, time.Hour, c.Epoch())
	inFlight := c.Epoch()
	c.Forget("k")
	_, _, ok := c.Lookup("k", 1, 0)
	assert.False(t, ok, "forgotten")
	c.Remember("k", 1, 0, 2, time.Hour, inFlight)
	c.Remember("j", 1, 0, 2, time.Hour, inFlight)
	for _, key := range []string{"k", "j"} {
		_, _, ok := c.Lookup(key, 1, 0)
		assert.False(t, ok, "%s: a denial sent before Forget was remembered", key)
	}
	c.Remember("k", 1, 0, 3, time.Hour, c.Epoch())
	v, _, ok := c.Lookup("k", 1, 0)
	require.True(t, ok, "sent after Forget")
	assert.Equal(t, 3, v)
}

// The deny cache stays within its size under a flood of denied keys.
func TestBounded(t *testing.T) {
	c := New[int](shards * 10)
	for i := range 10_000 {
		c.Remember(fmt.Sprint("k", i), 1, 0, i, time.Hour, 0)
	}
	n := 0
	for i := range c.shards {
		got := len(c.shards[i].until)
		require.LessOrEqual(t, got, 10, "shard %d holds %d entries, want at most 10", i, got)
		n += len(c.shards[i].until)
	}
	require.NotZero(t, n, "the cache holds nothing")
}

// Looking up allocates nothing, found or not.
func TestLookupAllocs(t *testing.T) {
	c := New[[4]int64](100)
	c.Remember("hot", 1, 0, [4]int64{1}, time.Hour, 0)
	if got := testing.AllocsPerRun(1000, func() { c.Lookup("hot", 1, 0); c.Lookup("absent", 1, 0) }); got != 0 {
		t.Errorf("Lookup: %v allocations, want 0", got)
	}
}

func BenchmarkDenyCacheHit(b *testing.B) {
	c := New[[8]int64](10_000)
	c.Remember("hot", 1, 0, [8]int64{}, time.Hour, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, ok := c.Lookup("hot", 1, 0); !ok {
				b.Fatal("miss")
			}
		}
	})
}

func BenchmarkDenyCacheMiss(b *testing.B) {
	c := New[[8]int64](10_000)
	for i := range 5000 {
		c.Remember("k"+strconv.Itoa(i), 1, 0, [8]int64{}, time.Hour, 0)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, ok := c.Lookup("absent", 1, 0); ok {
				b.Fatal("hit")
			}
		}
	})
}
