package redlimit

import (
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
