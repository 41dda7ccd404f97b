package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/outage"
	"github.com/redlimit/redlimit/internal/redistest"
)

// What checkClient relies on: go-redis answers a command run with an
// already cancelled context from its pool, without dialling, with
// redis.ErrClosed when the client is closed and the context's error when
// it is open, for a Client, a Ring and the nodes of a ClusterClient (whose
// own Ping retries and ends with the context's error either way). An
// AutoPipeliner ignores the context and sends the command, so it is asked
// IsClosed instead.
func TestCheckClientNoNetwork(t *testing.T) {
	srv := realServer(t)
	c := realCluster(t)
	var dials dialCounter

	o := redistest.TunedOptions(srv.Addr)
	o.Dialer = dials.dial
	client := redis.NewClient(o)
	co := redistest.TunedClusterOptions(c.Addrs())
	co.Dialer = dials.dial
	cluster := redis.NewClusterClient(co)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}, Dialer: dials.dial})
	apClient := redis.NewClient(o)
	defer apClient.Close()
	ap, err := apClient.AutoPipeline()
	require.NoError(t, err)

	for _, rdb := range []redis.UniversalClient{client, ring} {
		assert.ErrorIs(t, rdb.Ping(outage.Cancelled).Err(), context.Canceled, "%T", rdb)
	}
	for _, rdb := range []redis.UniversalClient{client, cluster, ring, ap} {
		assert.NoError(t, checkClient(rdb), "%T, open", rdb)
	}
	assert.Zero(t, dials.n.Load(), "dials for checks of open clients that never connected")

	// Connected, then closed.
	for _, rdb := range []redis.UniversalClient{client, cluster, ring, ap} {
		require.NoError(t, rdb.Ping(context.Background()).Err(), "%T", rdb)
		assert.NoError(t, checkClient(rdb), "%T, open", rdb)
	}
	before := dials.n.Load()
	for _, rdb := range []redis.UniversalClient{client, cluster, ring, ap} {
		require.NoError(t, rdb.Close())
		err := checkClient(rdb)
		assert.ErrorIs(t, err, redis.ErrClosed, "%T, closed", rdb)
		assert.ErrorIs(t, err, ErrInvalidArgument, "%T, closed", rdb)
	}
	assert.Equal(t, before, dials.n.Load(), "dials for checks of closed clients")

	// A cluster client closed before it ever loaded the cluster's layout.
	fresh := redis.NewClusterClient(co)
	require.NoError(t, fresh.Close())
	assert.ErrorIs(t, checkClient(fresh), redis.ErrClosed)
}

// A constructor rejects a client that the program has already closed.
func TestClosedClientRejected(t *testing.T) {
	srv := realServer(t)
	clients := map[string]redis.UniversalClient{
		"Client":        redis.NewClient(redistest.TunedOptions(srv.Addr)),
		"ClusterClient": redis.NewClusterClient(redistest.TunedClusterOptions(realCluster(t).Addrs())),
		"Ring":          redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}}),
	}
	ap, err := tunedClient(t, srv.Addr).AutoPipeline()
	require.NoError(t, err)
	clients["AutoPipeliner"] = ap
	for name, rdb := range clients {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, rdb.Ping(context.Background()).Err())
			require.NoError(t, rdb.Close())
			lim, err := NewTokenBucket(rdb, PerSecond(10))
			assert.Nil(t, lim)
			assert.ErrorIs(t, err, redis.ErrClosed)
			assert.ErrorIs(t, err, ErrInvalidArgument)
			_, err = NewPolicy(rdb, []Rule{{Strategy: FixedWindow, Limit: PerSecond(10)}})
			assert.ErrorIs(t, err, redis.ErrClosed)
		})
	}
}

// A client closed by the program while a limiter uses it is a programming
// error, not an outage: calls return an error wrapping redis.ErrClosed,
// never a fallback decision; also when it is closed while Redis is down.
func TestClosedClientCalls(t *testing.T) {
	srv := realServer(t)
	clients := []struct {
		name string
		new  func() redis.UniversalClient
	}{
		{"Client", func() redis.UniversalClient { return redis.NewClient(redistest.TunedOptions(srv.Addr)) }},
		{"ClusterClient", func() redis.UniversalClient {
			return redis.NewClusterClient(redistest.TunedClusterOptions(realCluster(t).Addrs()))
		}},
		{"Ring", func() redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": srv.Addr}})
		}},
	}
	ctx := context.Background()
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			rdb := c.new()
			var tr transitions
			lim := newLimiter(t, rdb, TokenBucket, PerSecond(1000), WithOnTransition(tr.record), WithPrefix("closed"))
			res, err := lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, res.Degraded)
			require.NoError(t, rdb.Close())
			for i := range 3 {
				res, err := lim.Allow(ctx, "k")
				require.ErrorIs(t, err, redis.ErrClosed, "call %d", i)
				require.False(t, res.Degraded, "call %d", i)
			}
			assert.Empty(t, tr.list(), "a closed client marked Redis down")
		})
	}

	t.Run("closed during an outage", func(t *testing.T) {
		srv := redistest.Start(t)
		rdb := redis.NewClient(redistest.TunedOptions(srv.Addr))
		lim := newLimiter(t, rdb, TokenBucket, PerSecond(1000))
		_, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, srv.Kill())
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Degraded)
		require.NoError(t, rdb.Close())
		start := time.Now()
		require.Eventually(t, func() bool {
			_, err := lim.Allow(ctx, "k")
			return err != nil
		}, 2*time.Second, 5*time.Millisecond, "calls still answered by the fallback after the client was closed")
		t.Logf("calls fail %v after the client was closed", time.Since(start).Round(time.Millisecond))
		_, err = lim.Allow(ctx, "k")
		assert.ErrorIs(t, err, redis.ErrClosed)
	})
}

// A nil option or a nil client (typed or not) is an argument error from
// the constructor, never a panic then or on a call.
func TestNilArguments(t *testing.T) {
	srv := realServer(t)
	rdb := tunedClient(t, srv.Addr)
	var (
		nilClient  *redis.Client
		nilCluster *redis.ClusterClient
		nilRing    *redis.Ring
		nilAP      *redis.AutoPipeliner
	)
	for _, c := range []redis.UniversalClient{nil, nilClient, nilCluster, nilRing, nilAP} {
		assert.NotPanics(t, func() {
			lim, err := NewTokenBucket(c, PerSecond(10))
			assert.ErrorIs(t, err, ErrInvalidArgument, "%T", c)
			assert.Nil(t, lim)
			_, err = New(c, FixedWindow, PerSecond(10))
			assert.ErrorIs(t, err, ErrInvalidArgument, "%T", c)
			_, err = NewPolicy(c, []Rule{{Strategy: FixedWindow, Limit: PerSecond(10)}})
			assert.ErrorIs(t, err, ErrInvalidArgument, "%T", c)
		}, "%T", c)
	}
	assert.NotPanics(t, func() {
		_, err := NewTokenBucket(rdb, PerSecond(10), WithPrefix("x"), nil)
		assert.ErrorIs(t, err, ErrInvalidArgument)
		_, err = New(rdb, SlidingLog, PerSecond(10), nil)
		assert.ErrorIs(t, err, ErrInvalidArgument)
		_, err = NewPolicy(rdb, []Rule{{Strategy: FixedWindow, Limit: PerSecond(10)}}, nil)
		assert.ErrorIs(t, err, ErrInvalidArgument)
	})
}
