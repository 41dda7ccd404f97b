package evictwatch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEvicts(t *testing.T) {
	assert.False(t, Evicts(0, "allkeys-lru"), "maxmemory 0: no limit")
	assert.False(t, Evicts(1<<20, "noeviction"))
	assert.True(t, Evicts(1<<20, "volatile-ttl"))
}

// A node's first complete sample is its baseline; the first rise after it
// is reported, once for a spell of rises; a spell ends after Quiet without
// one, and the next rise is reported again. A server that refuses INFO is
// remembered as refused, and an incomplete sample changes nothing.
func TestCompare(t *testing.T) {
	w := &Watch{nodes: make(map[string]*node)}
	at := time.Unix(1_700_000_000, 0)
	info := func(evicted int64) []serverInfo {
		return []serverInfo{{addr: "a", evicted: evicted, maxmem: 1 << 20, policy: "allkeys-lru", complete: true}}
	}
	assert.Empty(t, w.compare(info(5), at), "the baseline")
	found := w.compare(info(9), at.Add(time.Second))
	require.Len(t, found, 1)
	assert.Equal(t, int64(4), found[0].rise)
	assert.Empty(t, w.compare(info(12), at.Add(2*time.Second)), "the same spell")
	assert.Empty(t, w.compare(info(12), at.Add(2*time.Second+Quiet)), "quiet for Quiet: the spell ends")
	found = w.compare(info(13), at.Add(3*time.Second+Quiet))
	require.Len(t, found, 1, "a new spell")
	assert.Equal(t, int64(1), found[0].rise)

	assert.Empty(t, w.compare([]serverInfo{{addr: "a", err: assert.AnError}}, at.Add(time.Hour)), "a failed sample")
	assert.Empty(t, w.compare([]serverInfo{{addr: "b", refused: true}}, at))
	known, refused := w.Node("b")
	assert.True(t, known && refused, "b refused INFO")
	known, refused = w.Node("a")
	assert.True(t, known && !refused)

	w.closed = true
	assert.Nil(t, w.compare(info(100), at.Add(2*time.Hour)), "a closed watch reports nothing")
}

func TestReport(t *testing.T) {
	r := Report{Addr: "", Rise: 3, MaxMemory: 1024, Policy: "allkeys-lru"}
	assert.Equal(t, "Redis (the client's server) evicted 3 keys since the last sample (maxmemory 1024, maxmemory-policy allkeys-lru)", r.String())
}
