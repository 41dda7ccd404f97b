package redlimit

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// WithRedisFunctions makes the limiter decide with a Redis Function
// (FCALL) instead of a script (EVALSHA), where the server has them (Redis
// 7.0 and later, Valkey): Redis then makes the script's Lua functions once,
// when it loads the library, instead of on every call, and executes 8 to
// 14% fewer instructions per decision (see BENCHMARKS.md). It applies to the limiter's own rules; limits from
// WithLimitFunc or WithRulesFunc, and settling a reservation, stay scripts.
//
// The library is loaded on the first call that finds it missing, on the
// node that serves the key (FUNCTION LOAD), and again after a FUNCTION
// FLUSH, a failover to a node without it, or a new cluster node. Where
// functions are missing (Redis 6, miniredis), or the user may not load or
// call them, the limiter uses scripts, as without this option.
//
// Unlike a script, a library stays in Redis: it is saved with the data,
// replicated, and never evicted. There is one per set of rules (its name,
// "redlimit_" and 16 hex digits, is a hash of its code), so a program that
// changes its limits on every deploy leaves one behind each time; they
// take 46 KB (one rule, a token bucket) to 118 KB (four rules of four
// strategies) each, measured on Redis 7.0, and FUNCTION DELETE
// removes one (a limiter that still uses it loads it again). Past
// maxmemory, Redis refuses every call of a function that may write, where
// it refuses a script only when it writes: such a call runs the script,
// so that a denial is still answered, as without this option.
func WithRedisFunctions() Option {
	return optionFunc(func(c *config) { c.functions = true })
}

// functionsByDefault turns WithRedisFunctions on for every limiter (a
// variable for the tests: REDLIMIT_TEST_FUNCTIONS=1 runs the suite so).
var functionsByDefault = false

// redisFunction is a decision script with its rules written in, as a
// library of Redis Functions: the script's head (common.lua and the
// strategies' files) runs once, at FUNCTION LOAD, and the rest, from
// args.lua on, is the body of the library's one function.
type redisFunction struct {
	name string // the library's and its function's
	code string // FUNCTION LOAD's argument
}

func newRedisFunction(files []string, checks string) *redisFunction {
	head, call := decisionHead(files), decisionCall(checks)
	sum := sha1.Sum([]byte(head + call))
	name := "redlimit_" + hex.EncodeToString(sum[:8])
	return &redisFunction{
		name: name,
		code: "#!lua name=" + name + "\n" + head +
			"redis.register_function('" + name + "', function(KEYS, ARGV)\n" + call + "\nend)\n",
	}
}

// fcall runs fn with keys and args, loading its library where it is
// missing. ok is false when the server could not run it: the caller then
// runs the script; and where the server has no functions or the user may
// not call or load them, the engine runs the script from then on.
func (e *engine) fcall(ctx context.Context, fn *redisFunction, keys []string, args []any) (reply any, err error, ok bool) {
	reply, err = e.rdb.FCall(ctx, fn.name, keys, args...).Result()
	switch {
	case err == nil || !isServerError(err):
		return reply, err, true
	case functionMissing(err):
		if err := e.loadFunction(ctx, fn, keys[0]); err != nil {
			if !isServerError(err) {
				return nil, err, true
			}
			// Not loaded: this call runs the script; and so do the
			// next ones unless the server may load it later.
			if !transient(err) {
				e.noFunctions.Store(true)
			}
			return nil, nil, false
		}
		reply, err = e.rdb.FCall(ctx, fn.name, keys, args...).Result()
		if err != nil && functionMissing(err) {
			// The key moved to another node meanwhile: this call
			// runs the script, and the next loads the library there.
			return nil, nil, false
		}
		return reply, err, true
	case functionsRefused(err):
		e.noFunctions.Store(true)
		return nil, nil, false
	case strings.HasPrefix(err.Error(), "OOM "):
		// Past maxmemory, Redis refuses a function that may write,
		// where a script is refused only when it writes: the script
		// then answers a denial.
		return nil, nil, false
	}
	return reply, err, true
}

// loadFunction loads fn's library on the node that serves key.
func (e *engine) loadFunction(ctx context.Context, fn *redisFunction, key string) error {
	load := func(c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, fn.code).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil // another call or instance loaded it
		}
		return err
	}
	switch c := e.rdb.(type) {
	case *redis.ClusterClient:
		m, err := c.MasterForKey(ctx, key)
		if err != nil {
			return err
		}
		return load(m)
	case *redis.Ring:
		s, err := c.GetShardClientForKey(key)
		if err != nil {
			return err
		}
		return load(s)
	}
	return load(e.rdb)
}

// isServerError reports whether err is a reply of the server (not of the
// network or the client).
func isServerError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// functionMissing reports whether err says that the node has no such
// function (not loaded yet, flushed, or a node that never had it).
func functionMissing(err error) bool {
	return strings.Contains(err.Error(), "Function not found")
}

// functionsRefused reports whether err says that the server has no
// functions (Redis 6, miniredis, a proxy) or that the user may not call
// them.
func functionsRefused(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") || strings.HasPrefix(msg, "noperm")
}

// transient reports whether a server's error says that a command may
// succeed later: the server is busy, loading, full or failing over, or the
// key is moving.
func transient(err error) bool {
	msg := err.Error()
	for _, p := range [...]string{"BUSY", "LOADING", "OOM", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK"} {
		if strings.HasPrefix(msg, p+" ") {
			return true
		}
	}
	return false
}
