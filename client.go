package redlimit

import (
	"context"
	"reflect"

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

// checkClient rejects a client the limiter cannot use.
func checkClient(rdb redis.UniversalClient) error {
	return nil
}

// cancelledCtx is done from the start. go-redis checks a command's context
// before it takes a connection: a command run with cancelledCtx never
// reaches the network.
var cancelledCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
