package redlimit

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"
)

// isNilClient reports whether rdb is nil, or a nil pointer in an interface
// (a typed nil, which would panic on the first call).
func isNilClient(rdb redis.UniversalClient) bool {
	if rdb == nil {
		return true
	}
	v := reflect.ValueOf(rdb)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// checkClient rejects a client the limiter cannot use: one that the program
// has closed. It does not touch the network.
func checkClient(rdb redis.UniversalClient) error {
	if closedNow(rdb) {
		return errorf("the Redis client is closed (%w): %w", redis.ErrClosed, ErrInvalidArgument)
	}
	return nil
}

// cancelledCtx is done from the start. go-redis checks whether its pool is
// closed (redis.ErrClosed) before it looks at the context, and the context
// before it takes a connection: a command run with cancelledCtx tells
// whether the client is closed and never reaches the network.
var cancelledCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// closedNow reports whether the program has closed rdb, as far as can be
// told without touching the network: false when it cannot tell.
func closedNow(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case *redis.Client:
		return errors.Is(c.Ping(cancelledCtx).Err(), redis.ErrClosed)
	case *redis.Ring:
		return errors.Is(c.Ping(cancelledCtx).Err(), redis.ErrClosed)
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
	for _, slot := range [...]int{0, 5500, 11000, numSlots - 1} {
		m, err := c.MasterForKey(cancelledCtx, probeTag(slot))
		if err != nil {
			// A closed client that never loaded the layout says so;
			// otherwise the layout could not be loaded without the
			// network, and nothing is known.
			return errors.Is(err, redis.ErrClosed)
		}
		if !errors.Is(m.Ping(cancelledCtx).Err(), redis.ErrClosed) {
			return false
		}
	}
	return true
}

// clientClosed reports whether the program has closed rdb, after a call
// failed with redis.ErrClosed: then the network may be used, to tell an
// AutoPipeliner whose client was closed from one that lost a connection.
func clientClosed(ctx context.Context, rdb redis.UniversalClient) bool {
	if closedNow(rdb) {
		return true
	}
	if ap, ok := rdb.(*redis.AutoPipeliner); ok {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return errors.Is(ap.Ping(ctx).Err(), redis.ErrClosed)
	}
	return false
}
