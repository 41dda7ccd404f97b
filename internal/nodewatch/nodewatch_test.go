package nodewatch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/hashslot"
)

// probe is the tests' probe script: a write, as the limiters' is.
var probe = redis.NewScript(`redis.call('SET', KEYS[1], '1', 'PX', 1000) return 1`)

// sub is a subscriber that records what the watch tells it.
type sub struct {
	every time.Duration

	mu      sync.Mutex
	queued  []Event // queued, not yet flushed
	flushed []Event
	gone    bool
}

func (s *sub) Interval() time.Duration { return s.every }

func (s *sub) Queue(e Event) {
	s.mu.Lock()
	s.queued = append(s.queued, e)
	s.mu.Unlock()
}

func (s *sub) Flush() {
	s.mu.Lock()
	s.flushed = append(s.flushed, s.queued...)
	s.queued = nil
	s.mu.Unlock()
}

func (s *sub) Gone() {
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
}

// events returns the events flushed so far.
func (s *sub) events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.flushed...)
}

// setup returns a miniredis server and a client of it, closed at the end.
func setup(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	return m, rdb
}

// loading returns the error of a server that loads its dataset.
func loading(t *testing.T, m *miniredis.Miniredis, rdb *redis.Client) error {
	t.Helper()
	m.SetError("LOADING Redis is loading the dataset in memory")
	err := rdb.Ping(context.Background()).Err()
	require.Error(t, err)
	return err
}

// Subscribers of one client and probe share a watch, which probes at the
// shortest of their intervals; the last to leave stops it.
func TestJoinShares(t *testing.T) {
	_, rdb := setup(t)
	a, b := &sub{every: 10 * time.Millisecond}, &sub{every: 5 * time.Millisecond}
	other := &sub{every: time.Second}
	w := Join(Key{Client: rdb, Probe: probe}, a)
	require.Same(t, w, Join(Key{Client: rdb, Probe: probe}, b), "the same key")
	w2 := Join(Key{Client: rdb, Probe: redis.NewScript("return 1")}, other)
	require.NotSame(t, w, w2, "another probe, another watch")
	assert.Equal(t, 2, Watching(rdb))
	assert.Equal(t, 5*time.Millisecond, w.Interval(), "the shortest interval")

	w.Leave(b)
	assert.Equal(t, 10*time.Millisecond, w.Interval(), "the shortest interval of those left")
	assert.False(t, w.Stopped())
	w.Leave(a)
	assert.True(t, w.Stopped(), "the last to leave stops it")
	w2.Leave(other)
	assert.Zero(t, Watching(rdb))
}

// An error that says the node cannot answer marks it down at once, for
// every subscriber; two probes in a row that succeed bring it back.
func TestOutageNode(t *testing.T) {
	m, rdb := setup(t)
	a, b := &sub{every: 5 * time.Millisecond}, &sub{every: 5 * time.Millisecond}
	w := Join(Key{Client: rdb, Probe: probe}, a)
	defer w.Leave(a)
	Join(Key{Client: rdb, Probe: probe}, b)
	defer w.Leave(b)
	require.False(t, w.AnyDown())

	err := loading(t, m, rdb)
	require.True(t, w.Outage("rl", "rl:{k}:tb", err))
	assert.True(t, w.AnyDown())
	assert.True(t, w.IsDown("rl:{other}:tb"), "one node: every key of a *redis.Client")
	assert.Equal(t, err, w.Cause("rl:{k}:tb"))
	for _, s := range []*sub{a, b} {
		require.Equal(t, []Event{{Down: true, Err: err}}, s.events(), "told down, and flushed")
	}
	require.True(t, w.Outage("rl", "rl:{k}:tb", err), "still an outage")
	assert.Len(t, a.events(), 1, "told once")

	m.SetError("")
	require.Eventually(t, func() bool { return len(b.events()) == 2 }, 5*time.Second, time.Millisecond, "back")
	back := b.events()[1]
	assert.False(t, back.Down)
	assert.Positive(t, back.Outage)
	assert.False(t, w.AnyDown())
	assert.Nil(t, w.Cause("rl:{k}:tb"))
}

// A subscriber that joins while a node is down is told so when it joins.
func TestJoinWhileDown(t *testing.T) {
	m, rdb := setup(t)
	a := &sub{every: time.Hour}
	w := Join(Key{Client: rdb, Probe: probe}, a)
	defer w.Leave(a)
	err := loading(t, m, rdb)
	require.True(t, w.Outage("rl", "k", err))

	late := &sub{every: time.Hour}
	Join(Key{Client: rdb, Probe: probe}, late)
	defer w.Leave(late)
	late.Flush()
	assert.Equal(t, []Event{{Down: true, Err: err}}, late.events())
}

// An error that may concern one call has the node probed: a probe that
// succeeds forgets it, one that fails marks it down with the probe's error.
func TestOutageCall(t *testing.T) {
	for _, tt := range []struct {
		name     string
		failing  bool
		wantDown bool
	}{
		{"the node answers", false, false},
		{"the node fails", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, rdb := setup(t)
			a := &sub{every: time.Hour}
			w := Join(Key{Client: rdb, Probe: probe}, a)
			defer w.Leave(a)
			if tt.failing {
				m.SetError("LOADING Redis is loading the dataset in memory")
			}
			require.True(t, w.Outage("rl", "k", context.DeadlineExceeded))
			probed := func() bool { w.mu.Lock(); defer w.mu.Unlock(); return len(w.nodes) == 0 || w.nodes[""].down }
			require.Eventually(t, probed, 5*time.Second, time.Millisecond, "probed")
			assert.Equal(t, tt.wantDown, w.AnyDown())
			if tt.wantDown {
				require.Eventually(t, func() bool { return len(a.events()) == 1 }, 5*time.Second, time.Millisecond)
				assert.ErrorContains(t, a.events()[0].Err, "LOADING", "the probe's error")
			} else {
				assert.Empty(t, a.events())
			}
		})
	}
}

// An answer, a bug or a client the program closed is not an outage; the
// closed client is told to every subscriber.
func TestNotOutage(t *testing.T) {
	_, rdb := setup(t)
	a := &sub{every: time.Hour}
	w := Join(Key{Client: rdb, Probe: probe}, a)
	defer w.Leave(a)
	for _, err := range []error{nil, redis.Nil, errors.New("a bug"), context.Canceled} {
		assert.False(t, w.Outage("rl", "k", err), "%v", err)
	}
	assert.False(t, a.gone)
	require.NoError(t, rdb.Close())
	assert.False(t, w.Outage("rl", "k", rdb.Ping(context.Background()).Err()), "closed")
	assert.True(t, a.gone, "told the client is gone")
	assert.False(t, w.AnyDown())
}

// A probe key is short, in the slot of the key it stands for, and ends
// with ProbeSuffix; a *redis.Client is one node, "".
func TestLocate(t *testing.T) {
	_, rdb := setup(t)
	for _, state := range []string{"rl:{k}:tb", "x", strings.Repeat("k", 10_000), "{}"} {
		sc := locate(rdb, "rl", state)
		assert.Equal(t, hashslot.Of(state), hashslot.Of(sc.key), "%.20q", state)
		assert.LessOrEqual(t, len(sc.key), len("rl:{abc}:p"))
		assert.True(t, strings.HasSuffix(sc.key, ProbeSuffix))
		assert.Empty(t, sc.id)
		assert.Same(t, rdb, sc.probe)
		assert.Empty(t, nodeID(rdb, state))
	}
}
