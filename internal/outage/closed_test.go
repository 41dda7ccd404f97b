package outage

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client that the program closed is told from an open one, without the
// network for a Client and a Ring, and with one Ping for an AutoPipeliner.
func TestClosed(t *testing.T) {
	m := miniredis.RunT(t)
	base := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = base.Close() })
	ap, err := base.AutoPipeline()
	require.NoError(t, err)
	for name, rdb := range map[string]redis.UniversalClient{
		"Client":        redis.NewClient(&redis.Options{Addr: m.Addr()}),
		"Ring":          redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": m.Addr()}}),
		"AutoPipeliner": ap,
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			require.NoError(t, rdb.Ping(ctx).Err())
			assert.False(t, ClosedNow(rdb), "open")
			assert.False(t, ClientClosed(ctx, rdb), "open")
			require.NoError(t, rdb.Close())
			assert.True(t, ClosedNow(rdb), "closed")
			assert.True(t, ClientClosed(ctx, rdb), "closed")
		})
	}
}

// Cancelled is done, and a command run with it never reaches the server.
func TestCancelled(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	require.ErrorIs(t, Cancelled.Err(), context.Canceled)
	assert.ErrorIs(t, rdb.Set(Cancelled, "k", "v", 0).Err(), context.Canceled)
	assert.False(t, m.Exists("k"), "not sent")
}
