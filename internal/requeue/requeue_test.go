package requeue

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func never(string) bool { return false }

// counted returns a call of key that counts its tries in tries and asks
// to be made again while again is set.
func counted(key string, until time.Time, tries *atomic.Int32, again *atomic.Bool) Call {
	return Call{Key: key, Until: until, Do: func(context.Context) bool {
		tries.Add(1)
		return again.Load()
	}}
}

// A pass skips the calls of a node marked down, drops those past Until
// and makes the others; a later pass makes the skipped ones once their
// node is back, and the goroutine ends with the queue empty.
func TestPassSkipsDownDropsLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		down.Store(true)
		q := New(func(key string) bool { return key == "down" && down.Load() }, time.Second, 10)
		defer q.Close(false)
		now := time.Now()
		var up, late, held atomic.Int32
		var no atomic.Bool
		require.True(t, q.Add(counted("down", now.Add(time.Hour), &held, &no), false))
		require.True(t, q.Add(counted("late", now, &late, &no), false))
		require.True(t, q.Add(counted("up", now.Add(time.Hour), &up, &no), true))
		synctest.Wait() // the kicked pass
		assert.Equal(t, int32(1), up.Load(), "the call of a node up")
		assert.Zero(t, late.Load(), "the call past its Until")
		assert.Zero(t, held.Load(), "the call of a node down")
		assert.Equal(t, 1, q.Len(), "pending")

		down.Store(false)
		time.Sleep(time.Second) // the next pass
		synctest.Wait()
		assert.Equal(t, int32(1), held.Load(), "made once its node is back")
		assert.Zero(t, q.Len(), "pending")
		q.mu.Lock()
		running := q.running
		q.mu.Unlock()
		assert.False(t, running, "the goroutine ends with the queue")
	})
}

// A call that Redis did not answer stops the pass: the calls after it
// wait for the next one, untried.
func TestPassStallsOnNoAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New(never, time.Second, 10)
		defer q.Close(false)
		far := time.Now().Add(time.Hour)
		var first, second atomic.Int32
		var again, no atomic.Bool
		again.Store(true)
		require.True(t, q.Add(counted("a", far, &first, &again), false))
		require.True(t, q.Add(counted("b", far, &second, &no), true))
		synctest.Wait()
		assert.Equal(t, int32(1), first.Load(), "tried")
		assert.Zero(t, second.Load(), "after a call that Redis did not answer")
		assert.Equal(t, 2, q.Len(), "both kept")

		again.Store(false)
		time.Sleep(time.Second)
		synctest.Wait()
		assert.Equal(t, int32(2), first.Load(), "tried again")
		assert.Equal(t, int32(1), second.Load(), "made with the next pass")
		assert.Zero(t, q.Len())
	})
}

// Close(true) tries each call once, those of a node marked down too, and
// returns how many it could not make; later Adds are refused.
func TestCloseFlush(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New(func(string) bool { return true }, time.Hour, 10) // every node down: no pass makes them
		far := time.Now().Add(time.Hour)
		var made, failed atomic.Int32
		var again, no atomic.Bool
		again.Store(true)
		require.True(t, q.Add(counted("a", far, &failed, &again), false))
		require.True(t, q.Add(counted("b", far, &made, &no), false))
		require.True(t, q.Add(counted("c", far, &made, &no), false))
		assert.Equal(t, 1, q.Close(true), "dropped: the call Redis did not answer")
		assert.Equal(t, int32(1), failed.Load())
		assert.Equal(t, int32(2), made.Load(), "made, after one that failed")
		assert.False(t, q.Add(counted("d", far, &made, &no), true), "after Close")
		assert.Zero(t, q.Close(true), "a second Close")
	})
}

// Close(false) drops what is pending, untried.
func TestCloseDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New(func(string) bool { return true }, time.Hour, 10)
		var tries atomic.Int32
		var no atomic.Bool
		require.True(t, q.Add(counted("a", time.Now().Add(time.Hour), &tries, &no), false))
		assert.Equal(t, 1, q.Close(false))
		assert.Zero(t, tries.Load())
	})
}

// The queue holds at most max calls, the one being made included: a call
// taken off the queue by a pass in flight (a Redis that hangs holds it up
// to Timeout) still waits, and must not make room for another.
func TestBoundExact(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const maxCalls = 50
	q := New(never, time.Hour, maxCalls)
	far := time.Now().Add(time.Hour)
	started, unblock := make(chan struct{}), make(chan struct{})
	var once sync.Once // Close may make it again: its pass ended with the queue
	require.True(t, q.Add(Call{Key: "s", Until: far, Do: func(context.Context) bool {
		once.Do(func() { close(started) })
		<-unblock
		return false
	}}, true))
	<-started // the pass has taken it off the queue, and makes it
	accepted := 1
	for range maxCalls + 10 {
		if q.Add(Call{Key: "s", Until: far, Do: func(context.Context) bool { return false }}, false) {
			accepted++
		}
	}
	assert.Equal(t, maxCalls, q.Len(), "pending, the one in flight included")
	close(unblock)
	assert.Equal(t, maxCalls, accepted, "calls accepted")
	assert.Zero(t, q.Close(true), "dropped")
}
