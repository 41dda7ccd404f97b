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
// when it loads the library, instead of on every call, and executes 10 to
// 16% fewer instructions per decision (see BENCHMARKS.md). It applies to
// the limiter's own rules, with the same decisions; limits from
// WithLimitFunc or WithRulesFunc, limiters made after a process has made
// its most scripts with rules written in (128), and settling a
// reservation stay scripts.
//
// The library is loaded on the first call that finds it missing, on the
// node that serves the key (FUNCTION LOAD), and again after a FUNCTION
// FLUSH, a failover to a node without it, or a new cluster node. (Through
// an AutoPipeliner over a cluster or ring, FUNCTION LOAD has no key to be
// routed by: the library reaches every node after a few tries, the calls
// in between running the script.) Where functions are missing (Redis 6,
// miniredis, a proxy without FCALL), or the user may not call or load
// them, the limiter uses the script, as without this option, and stops
// trying.
//
// Unlike a script, a library stays in Redis: it is saved with the data,
// replicated, and never evicted. There is one per set of rules (its name,
// "redlimit_" and 16 hex digits, is a hash of its code), so a program that
// changes its limits on every deploy leaves one behind each time; they
// take 46 KB (one rule, a token bucket) to 118 KB (four rules of four
// strategies) each, measured on Redis 7.0, and FUNCTION DELETE removes
// one (a limiter that still uses it loads it again).
//
// Past maxmemory, with too few replicas for min-replicas-to-write, or
// after a failed save, Redis refuses every call of a function that may
// write, where it refuses a script only when it writes: such a call runs
// the script, so that a denial is still answered, as without this option.
func WithRedisFunctions() Option {
	return optionFunc(func(c *config) { c.functions = true })
}

// functionsByDefault turns WithRedisFunctions on for every limiter (a
// variable for the tests: REDLIMIT_TEST_FUNCTIONS=1 runs the suite so).
var functionsByDefault = false

// redisFunction is a decision script with its rules written in, as a
// library of Redis Functions: the script's head (common.lua, the
// strategies' files and, for several rules, queue.lua and written.lua)
// runs once, at FUNCTION LOAD, and the rest, from args.lua on, is the body
// of the library's one function.
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
// missing. ok is false when the server did not run it: the caller then
// runs the script; and where the server has no functions, or the user may
// not call or load them, the engine runs the script from then on. (Every
// path to the script follows an FCALL that Redis refused before running
// it: no decision is made twice.)
func (e *engine) fcall(ctx context.Context, fn *redisFunction, keys []string, args []any) (reply any, err error, ok bool) {
	reply, err = e.rdb.FCall(ctx, fn.name, keys, args...).Result()
	if err == nil || !isServerError(err) {
		return reply, err, true
	}
	if functionMissing(err) {
		if err := e.loadFunction(ctx, fn, keys[0]); err != nil {
			if !isServerError(err) {
				return nil, err, true
			}
			// Not loaded: this call runs the script; and so do the
			// next ones where the server will never load it.
			if loadRefused(err) {
				e.noFunctions.Store(true)
			}
			return nil, nil, false
		}
		reply, err = e.rdb.FCall(ctx, fn.name, keys, args...).Result()
		if err == nil || !isServerError(err) {
			return reply, err, true
		}
		if functionMissing(err) {
			// The key moved to another node meanwhile (or, through
			// an AutoPipeliner over a cluster, the library went to
			// another node): this call runs the script, and the next
			// loads the library again.
			return nil, nil, false
		}
	}
	switch {
	case functionsRefused(err):
		e.noFunctions.Store(true)
		return nil, nil, false
	case refusedBeforeRunning(err):
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
// FCALL (Redis 6 and miniredis: unknown command; a proxy: unsupported) or
// that the user may not call it: an error about the command itself, which
// names it (an error of the function's own code, or about a key, does
// not).
func functionsRefused(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "fcall")
}

// loadRefused reports whether an error of FUNCTION LOAD says that the
// server will never load the library: it has no such command, the user may
// not run it, or the code does not load there.
func loadRefused(err error) bool {
	msg := strings.ToLower(err.Error())
	for _, s := range [...]string{"unknown command", "unknown subcommand", "unsupported", "not supported", "noperm", "error registering", "error compiling"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// refusedBeforeRunning reports whether Redis refused to start a function
// that may write, where it runs a script until the script writes: past
// maxmemory (OOM), with too few replicas (NOREPLICAS) or after a failed
// save (MISCONF). The script then still answers a denial.
func refusedBeforeRunning(err error) bool {
	return redis.IsOOMError(err) || redis.HasErrorPrefix(err, "NOREPLICAS") || redis.HasErrorPrefix(err, "MISCONF")
}
