package localsem

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// A semaphore's leases, released, extended and expiring in any order,
// against a model: a map of each live lease's expiry.
func TestModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const capacity, ttl = 50, time.Minute
	s := New(capacity)
	now := t0
	model := map[*uint64]time.Time{} // by the lease's id, which Extend changes
	var leases []*uint64
	liveAt := func() int {
		n := 0
		for _, exp := range model {
			if now.Before(exp) {
				n++
			}
		}
		return n
	}
	for step := range 20_000 {
		switch op := rng.IntN(10); {
		case op < 4:
			id, a, ok := s.Acquire(now, ttl, Held{}, capacity, 0)
			require.True(t, ok)
			want := liveAt() < capacity
			require.Equal(t, want, a.Allowed, "step %d: acquire with %d live", step, liveAt())
			if a.Allowed {
				l := &id
				model[l] = now.Add(ttl)
				leases = append(leases, l)
				require.Equal(t, capacity-liveAt(), a.Remaining, "step %d", step)
			}
		case op < 7 && len(leases) > 0:
			i := rng.IntN(len(leases))
			l := leases[i]
			leases = slices.Delete(leases, i, i+1)
			s.Release(l)
			delete(model, l)
		case op < 8 && len(leases) > 0:
			l := leases[rng.IntN(len(leases))]
			want := now.Before(model[l])
			require.Equal(t, want, s.Extend(l, now, ttl), "step %d: extend", step)
			if want {
				model[l] = now.Add(ttl)
			}
		default:
			now = now.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
		}
		s.mu.Lock()
		s.pruneLocked(now)
		live, n := s.live, len(s.leases)
		s.mu.Unlock()
		require.Equal(t, liveAt(), live, "step %d: live leases", step)
		require.LessOrEqual(t, n, 2*live+8, "step %d: leases kept, released ones included", step)
	}
}

// Leases held elsewhere take slots, and their expiries bound RetryAfter and
// ResetAfter; the slots kept for the priority share deny with ByPriority.
func TestAcquireHeldAndKept(t *testing.T) {
	const ttl = 10 * time.Second
	s := New(3)
	_, a, ok := s.Acquire(t0, ttl, Held{}, 3, 0)
	require.True(t, ok)
	require.True(t, a.Allowed)
	assert.Equal(t, Answer{Allowed: true, Remaining: 2, ResetAfter: ttl}, a)

	held := Held{N: 1, First: t0.Add(time.Second), Last: t0.Add(20 * time.Second)}
	for _, tt := range []struct {
		name string
		held Held
		kept int
		want Answer
	}{
		{"a slot left", Held{}, 0, Answer{Allowed: true, Remaining: 1, ResetAfter: ttl}},
		{"held elsewhere", held, 1, Answer{RetryAfter: time.Second, ResetAfter: 20 * time.Second, ByPriority: true}},
		{"kept for the share", Held{}, 2, Answer{RetryAfter: ttl, ResetAfter: ttl, ByPriority: true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := New(3)
			_, _, _ = s.Acquire(t0, ttl, Held{}, 3, 0)
			_, a, ok := s.Acquire(t0, ttl, tt.held, 3, tt.kept)
			require.True(t, ok)
			assert.Equal(t, tt.want, a)
		})
	}
}

// A retired semaphore takes no lease; one that holds a live lease is not
// retired, and says when its last lease expires.
func TestRetire(t *testing.T) {
	const ttl = time.Second
	s := New(2)
	id, a, _ := s.Acquire(t0, ttl, Held{}, 2, 0)
	require.True(t, a.Allowed)
	dead, last := s.Retire(t0)
	assert.False(t, dead)
	assert.Equal(t, t0.Add(ttl), last)

	require.True(t, s.Extend(&id, t0.Add(ttl/2), ttl))
	_, last = s.Retire(t0.Add(ttl / 2))
	assert.Equal(t, t0.Add(3*ttl/2), last, "extended")
	assert.True(t, s.Release(&id), "empty")
	assert.Zero(t, s.Live())

	dead, _ = s.Retire(t0)
	require.True(t, dead)
	assert.True(t, s.Dead())
	_, _, ok := s.Acquire(t0, ttl, Held{}, 2, 0)
	assert.False(t, ok, "retired")
}
