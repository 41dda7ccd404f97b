package answers

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An answer is of use until its reset, only for the limits it was given
// under, and only for its key and rule; a negative left notes nothing.
func TestExpire(t *testing.T) {
	a := New(100, 4)
	const sig, now = 7, int64(time.Hour)
	a.Note("k", sig, now-int64(time.Millisecond), now, time.Second, []int64{2, -1})
	h := a.Hash("k")
	v, ok := a.Get(h, 0, sig, now)
	require.True(t, ok, "just noted")
	assert.EqualValues(t, 2, v.Remaining)
	assert.Equal(t, now, v.At)
	assert.Equal(t, now-int64(time.Millisecond), v.Sent(), "sent")
	assert.Equal(t, now+int64(time.Second), v.End(), "end")
	_, ok = a.Get(h, 0, sig, now+int64(time.Second))
	assert.False(t, ok, "at its reset")
	_, ok = a.Get(h, 0, sig+1, now)
	assert.False(t, ok, "under other limits")
	_, ok = a.Get(a.Hash("other"), 0, sig, now)
	assert.False(t, ok, "another key")
	_, ok = a.Get(h, 1, sig, now)
	assert.False(t, ok, "a rule the answer said nothing of")
	assert.Equal(t, 1, a.Len(), "answers held")
}

// An answer's reset is kept in whole seconds, rounded up, and its round
// trip in µs, from the time sent to the answer (none for a clock that
// went back).
func TestTimes(t *testing.T) {
	a := New(100, 1)
	now := int64(time.Hour)
	for _, c := range []struct {
		name       string
		sent       int64
		resetAfter time.Duration
		wantSent   int64
		wantEnd    int64
	}{
		{"1.5s", now - 1500, 1500 * time.Millisecond, now - 1000, now + int64(2*time.Second)},
		{"a whole second", now - int64(time.Second), time.Second, now - int64(time.Second), now + int64(time.Second)},
		{"sent after", now + 5000, time.Minute, now, now + int64(time.Minute)},
	} {
		a.Note("k", 0, c.sent, now, c.resetAfter, []int64{1})
		v, ok := a.Get(a.Hash("k"), 0, 0, now)
		require.True(t, ok, c.name)
		if got, want := v.Sent(), c.wantSent; got != want {
			t.Errorf("%s: Sent got now%+d, want now%+d", c.name, got-now, want-now)
		}
		if got, want := v.End(), c.wantEnd; got != want {
			t.Errorf("%s: End got now%+d, want now%+d", c.name, got-now, want-now)
		}
	}
}

// Forget drops every rule's answer of the key, and no other key's.
func TestForget(t *testing.T) {
	a := New(100, 3)
	a.Note("k", 0, 0, 0, time.Minute, []int64{1, 2, 3})
	a.Note("j", 0, 0, 0, time.Minute, []int64{1})
	a.Forget("k")
	for i := range 3 {
		_, ok := a.Get(a.Hash("k"), i, 0, 0)
		assert.False(t, ok, "rule %d of the key forgotten", i)
	}
	_, ok := a.Get(a.Hash("j"), 0, 0, 0)
	assert.True(t, ok, "another key")
	assert.Equal(t, 1, a.Len())
}

// A shard holds at most its share of max: a new answer takes the place of
// another, and is found.
func TestBounded(t *testing.T) {
	a := New(shards*2, 1)
	for i := range 1000 {
		key := "k" + strconv.Itoa(i)
		a.Note(key, 0, 0, 0, time.Minute, []int64{1})
		_, ok := a.Get(a.Hash(key), 0, 0, 0)
		require.True(t, ok, "%s, just noted", key)
	}
	for i := range a.shards {
		assert.LessOrEqual(t, len(a.shards[i].m), 2, "shard %d", i)
	}
	assert.LessOrEqual(t, a.Len(), shards*2)
}

// Noting an answer about a key already noted allocates nothing.
func TestNoteAllocs(t *testing.T) {
	a := New(100_000, 16)
	state := "redlimit:{user:12345}:tb1000000"
	left := []int64{3, -1, 5}
	if got := testing.AllocsPerRun(1000, func() { a.Note(state, 1, 0, 0, time.Second, left) }); got != 0 {
		t.Errorf("Note: %v allocations, want 0", got)
	}
}

// heapInUse returns the bytes of the heap in use, after collections.
func heapInUse() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC() // the second frees what the first's finalizers and sweeps left
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// noteKeys notes in a an answer for each of keys keys of one rule, as
// decisions on Redis do.
func noteKeys(a *Table, keys int) {
	left := []int64{3}
	buf := []byte("redlimit:{user:")
	for i := range keys {
		state := string(append(strconv.AppendInt(buf[:15], int64(i), 10), "}:tb1000000"...))
		a.Note(state, 1, 0, 0, time.Minute, left)
	}
}

// Issue 37 item 1: what the answers take follows the keys seen: at most
// about 150 bytes a key, and a few KB for a limiter that sees few keys
// (the fixed table took 24 KB a stripe of 512 slots touched: 244 KB for
// 10 keys, 3.1 MB from about 5,000).
func TestFollowKeys(t *testing.T) {
	for _, c := range []struct{ keys, tables int }{{10, 50}, {5000, 20}, {100_000, 2}} {
		if c.keys == 100_000 && testing.Short() {
			continue
		}
		tables := make([]*Table, c.tables)
		before := heapInUse()
		for i := range tables {
			tables[i] = New(100_000, 16) // the default WithFallbackKeys
			noteKeys(tables[i], c.keys)
		}
		per := float64(heapInUse()-before) / float64(c.tables)
		runtime.KeepAlive(tables)
		t.Logf("%d keys: %.1f KB a table (%.0f bytes a key)", c.keys, per/1e3, per/float64(c.keys))
		assert.LessOrEqual(t, per, float64(150*c.keys+4096), "%d keys: %.0f bytes a table, want at most 150 a key and 4 KB", c.keys, per)
	}
}
