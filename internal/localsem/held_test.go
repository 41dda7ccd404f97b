package localsem

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Held counts each key's leases until they expire, are removed, or (when
// extended) a ttl after the extension; a released lease is not brought back
// by an extension that comes after its release.
func TestHeld(t *testing.T) {
	now := t0
	h := NewHeld(func() time.Time { return now }, 10*time.Second)
	var a, b Entry
	h.Add(&a, "k")
	now = now.Add(4 * time.Second)
	h.Add(&b, "k")
	assert.Equal(t, Count{N: 2, First: t0.Add(10 * time.Second), Last: t0.Add(14 * time.Second)}, h.At("k", now))
	assert.Equal(t, Count{}, h.At("other", now))

	var released atomic.Bool
	now = t0.Add(6 * time.Second)
	h.Extend(&a, &released)
	assert.Equal(t, Count{N: 2, First: t0.Add(14 * time.Second), Last: t0.Add(16 * time.Second)}, h.At("k", now), "a extended")

	h.Remove(&b)
	released.Store(true)
	h.Remove(&a)
	h.Extend(&a, &released)
	assert.Equal(t, Count{}, h.At("k", now), "released, then extended: not counted")
	assert.Zero(t, h.keys())

	h.Add(&a, "k")
	assert.Equal(t, 1, h.At("k", now).N)
	assert.Equal(t, Count{}, h.At("k", now.Add(10*time.Second)), "expired")
	assert.Zero(t, h.keys(), "a key with no live lease is dropped")
}

// Keys whose leases all expired are swept once the map doubles, so a
// Held keeps about the keys with live leases.
func TestHeldSweeps(t *testing.T) {
	now := t0
	h := NewHeld(func() time.Time { return now }, time.Second)
	for i := range 1000 {
		h.Add(&Entry{}, fmt.Sprint(i))
		now = now.Add(10 * time.Millisecond) // 100 live at a time
	}
	require.LessOrEqual(t, h.keys(), 2*100+minSweep)
	var nilHeld *Held
	nilHeld.Add(&Entry{}, "k")
	assert.Equal(t, Count{}, nilHeld.At("k", now), "a nil Held holds nothing")
}
