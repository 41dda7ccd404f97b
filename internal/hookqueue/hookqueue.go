// Package hookqueue reports events to a program's hook in the order they
// happened, from whichever goroutine noticed them: events are added under
// a lock (by code that may hold other locks), and reported later by Flush,
// one at a time, with no lock held, so that the hook may call back into
// its caller, even to close it.
package hookqueue

import "sync"

// Queue holds the events not yet reported. Its zero value is an empty,
// open queue; it is safe for concurrent use.
type Queue[T any] struct {
	mu       sync.Mutex
	closed   bool
	items    []T  // not yet reported, oldest first
	draining bool // a goroutine is reporting the queue
}

// Add queues v, unless q is closed. It never calls the hook.
func (q *Queue[T]) Add(v T) {
	q.mu.Lock()
	if !q.closed {
		q.items = append(q.items, v)
	}
	q.mu.Unlock()
}

// Flush reports the queued events to f in order, one at a time, unless
// another goroutine is reporting them (it then reports these too). A nil f
// drops them. A panic of f is dropped: the hook runs on whichever
// goroutine noticed the event, where a panic could end the process, and
// reporting must go on for the next events.
func (q *Queue[T]) Flush(f func(T)) {
	q.mu.Lock()
	if f == nil {
		q.items = nil
	}
	if q.draining {
		q.mu.Unlock()
		return
	}
	q.draining = true
	for len(q.items) > 0 {
		v := q.items[0]
		var zero T
		q.items[0] = zero
		q.items = q.items[1:]
		q.mu.Unlock()
		call(f, v)
		q.mu.Lock()
	}
	q.items = nil
	q.draining = false
	q.mu.Unlock()
}

// call calls f with v, dropping a panic.
func call[T any](f func(T), v T) {
	defer func() { _ = recover() }()
	f(v)
}

// Close drops the events not reported yet, and those added from now on.
func (q *Queue[T]) Close() {
	q.mu.Lock()
	q.closed = true
	q.items = nil
	q.mu.Unlock()
}
