package hookqueue

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Events are reported in order, once, and a panicking hook does not stop
// the next ones.
func TestFlushInOrder(t *testing.T) {
	var q Queue[int]
	var got []int
	for i := range 5 {
		q.Add(i)
	}
	q.Flush(func(v int) {
		got = append(got, v)
		if v == 2 {
			panic("a hook's bug")
		}
	})
	assert.Equal(t, []int{0, 1, 2, 3, 4}, got)
	q.Flush(func(v int) { got = append(got, v) })
	assert.Len(t, got, 5, "reported once")
}

// The hook may add and flush from inside: what it adds is reported by the
// Flush already running, after what was queued before it.
func TestFlushReentrant(t *testing.T) {
	var q Queue[string]
	var got []string
	var hook func(string)
	hook = func(v string) {
		got = append(got, v)
		if v == "a" {
			q.Add("c")
			q.Flush(hook) // another goroutine's Flush would return at once too
		}
	}
	q.Add("a")
	q.Add("b")
	q.Flush(hook)
	assert.Equal(t, []string{"a", "b", "c"}, got)
}

// A nil hook drops the queue; a closed queue drops what it holds and what
// comes.
func TestNilHookAndClose(t *testing.T) {
	var q Queue[int]
	q.Add(1)
	q.Flush(nil)
	var got []int
	record := func(v int) { got = append(got, v) }
	q.Flush(record)
	assert.Empty(t, got, "dropped by a nil hook")

	q.Add(2)
	q.Close()
	q.Add(3)
	q.Flush(record)
	assert.Empty(t, got, "dropped by Close")
}

// Many goroutines adding and flushing report every event once, each
// goroutine's in the order it added them.
func TestConcurrent(t *testing.T) {
	var q Queue[[2]int]
	var mu sync.Mutex
	got := make(map[int][]int)
	record := func(v [2]int) { mu.Lock(); got[v[0]] = append(got[v[0]], v[1]); mu.Unlock() }
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				q.Add([2]int{g, i})
				q.Flush(record)
			}
		})
	}
	wg.Wait()
	q.Flush(record)
	require.Len(t, got, 8)
	for g, seq := range got {
		require.Len(t, seq, 100, "goroutine %d", g)
		for i, v := range seq {
			require.Equal(t, i, v, "goroutine %d", g)
		}
	}
}
