package redlimit

import (
	"reflect"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/outage"
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
	if outage.ClosedNow(rdb) {
		return errorf("the Redis client is closed (%w): %w", redis.ErrClosed, ErrInvalidArgument)
	}
	return nil
}
