package holdhint

import (
	"testing"
	"time"
)

func TestHint(t *testing.T) {
	h := New(time.Second)
	if got, want := h.RetryAfter(0, 1), time.Second; got != want {
		t.Fatalf("before any hold: got %v, want the default %v", got, want)
	}
	if got, want := h.RetryAfter(200*time.Millisecond, 1), 200*time.Millisecond; got != want {
		t.Fatalf("bounded: got %v, want %v", got, want)
	}
	h.Observe(300 * time.Millisecond)
	if got, want := h.RetryAfter(10*time.Second, 1), 300*time.Millisecond; got != want {
		t.Fatalf("after one hold of 300ms: got %v, want %v", got, want)
	}
	for range 100 {
		h.Observe(100 * time.Millisecond)
	}
	if got := h.RetryAfter(10*time.Second, 1); got < 100*time.Millisecond || got > 101*time.Millisecond {
		t.Fatalf("after 100 holds of 100ms: got %v, want 100ms", got)
	}
	if got, want := h.RetryAfter(10*time.Second, 4), 25*time.Millisecond; got < want-time.Millisecond || got > want+time.Millisecond {
		t.Fatalf("4 slots: got %v, want a quarter of the average, %v", got, want)
	}
	if got, want := New(time.Second).RetryAfter(0, 4), time.Second; got != want {
		t.Fatalf("4 slots, before any hold: got %v, want the default %v", got, want)
	}
	h.Observe(900 * time.Millisecond)
	if got, want := h.RetryAfter(10*time.Second, 1), 200*time.Millisecond; got < want-time.Millisecond || got > want+time.Millisecond {
		t.Fatalf("one hold of 900ms moves it by an eighth: got %v, want %v", got, want)
	}
}
