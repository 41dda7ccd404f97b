package localsem

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// A semaphore's leases, released, extended and expiring in any order,
// against a model: a map of each live lease's expiry.
func TestSemModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const capacity, ttl = 50, time.Minute
	s := New(capacity)
	now := t0
	model := map[*uint64]time.Time{}
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
			id, g, ok := s.Acquire(now, ttl, Count{}, capacity, 0)
			require.True(t, ok)
			want := liveAt() < capacity
			require.Equal(t, want, g.Allowed, "step %d: acquire with %d live", step, liveAt())
			if g.Allowed {
				l := &id
				model[l] = now.Add(ttl)
				leases = append(leases, l)
				require.Equal(t, capacity-liveAt(), g.Remaining, "step %d", step)
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
		live := s.Live(now)
		s.mu.Lock()
		n := len(s.leases)
		s.mu.Unlock()
		require.Equal(t, liveAt(), live, "step %d: live leases", step)
		require.LessOrEqual(t, n, 2*live+8, "step %d: leases kept, released ones included", step)
	}
}

// A full semaphore denies with the waits until its first and last lease
// expire, the held Redis leases counted; slots kept for a priority share
// deny ByPriority; a retired semaphore takes nothing.
func TestSemDenials(t *testing.T) {
	const ttl = 10 * time.Second
	s := New(3)
	_, g, ok := s.Acquire(t0, ttl, Count{}, 3, 0)
	require.True(t, ok)
	require.True(t, g.Allowed)
	assert.Equal(t, 2, g.Remaining)
	held := Count{N: 1, First: t0.Add(2 * time.Second), Last: t0.Add(20 * time.Second)}
	_, g, _ = s.Acquire(t0.Add(time.Second), ttl, held, 3, 1)
	assert.Equal(t, Grant{RetryAfter: time.Second, ResetAfter: 19 * time.Second, ByPriority: true}, g, "the kept slot")
	_, g, _ = s.Acquire(t0.Add(time.Second), ttl, held, 3, 0)
	require.True(t, g.Allowed)
	assert.Zero(t, g.Remaining)
	_, g, _ = s.Acquire(t0.Add(time.Second), ttl, held, 3, 0)
	assert.Equal(t, Grant{RetryAfter: time.Second, ResetAfter: 19 * time.Second}, g, "full")

	dead, last := s.Retire(t0.Add(5 * time.Second))
	assert.False(t, dead)
	assert.Equal(t, t0.Add(11*time.Second), last)
	dead, _ = s.Retire(t0.Add(11 * time.Second))
	require.True(t, dead)
	assert.True(t, s.Dead())
	_, _, ok = s.Acquire(t0.Add(11*time.Second), ttl, Count{}, 3, 0)
	assert.False(t, ok, "a retired semaphore takes no lease")
}
