package outage

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/hashslot"
)

// Cancelled is done from the start. go-redis checks whether its pool is
// closed (redis.ErrClosed) before it looks at the context, and the context
// before it takes a connection: a command run with Cancelled tells whether
// the client is closed and never reaches the network.
var Cancelled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// ClosedNow reports whether the program has closed rdb, as far as can be
// told without touching the network: false when it cannot tell.
func ClosedNow(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return errors.Is(c.Ping(Cancelled).Err(), redis.ErrClosed)
	case *redis.Ring:
		return errors.Is(c.Ping(Cancelled).Err(), redis.ErrClosed)
	case *redis.ClusterClient:
		return clusterClosed(c)
	case *redis.AutoPipeliner:
		// It ignores a cancelled context: a Ping would be sent.
		return c.IsClosed()
	}
	return false
}

// clusterClosed reports whether c is closed. A closed ClusterClient closes
// the client of every node it knows; an open one may hold a closed node
// for a moment after a topology change. So c is closed when the masters of
// a few spread slots are all closed.
func clusterClosed(c *redis.ClusterClient) bool {
	for _, slot := range [...]int{0, 5500, 11000, hashslot.Count - 1} {
		m, err := c.MasterForKey(Cancelled, hashslot.Tag(slot))
		if err != nil {
			// A closed client that never loaded the layout says so;
			// otherwise the layout could not be loaded without the
			// network, and nothing is known.
			return errors.Is(err, redis.ErrClosed)
		}
		if !errors.Is(m.Ping(Cancelled).Err(), redis.ErrClosed) {
			return false
		}
	}
	return true
}

// ClientClosed reports whether the program has closed rdb, after a call
// failed with redis.ErrClosed: then the network may be used, to tell an
// AutoPipeliner whose client was closed from one that lost a connection.
func ClientClosed(ctx context.Context, rdb redis.UniversalClient) bool {
	if ClosedNow(rdb) {
		return true
	}
	if ap, ok := rdb.(*redis.AutoPipeliner); ok {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return errors.Is(ap.Ping(ctx).Err(), redis.ErrClosed)
	}
	return false
}
