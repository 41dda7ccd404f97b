package redlimit

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// functionsByDefault turns WithRedisFunctions on for every limiter (a
// variable for the tests: REDLIMIT_TEST_FUNCTIONS=1 runs the suite so).
var functionsByDefault = false

// redisFunction is a decision script with its rules written in, as a
// library of Redis Functions: the script's head (common.lua, the
// strategies' files and, for several rules, queue.lua and written.lua)
// runs once, at FUNCTION LOAD, and the rest, from args.lua on, is the body
// of the library's one function. A script specialised for one rule (see
// singleSource) is all body.
type redisFunction struct {
	name string // the library's and its function's
	code string // FUNCTION LOAD's argument
}

func newRedisFunction(files []string, count, checks string) *redisFunction {
	return newFunction(decisionHead(files), decisionCall(count, checks))
}

// newFunction returns the library whose head runs once, when it is loaded,
// and whose one function runs call: a general decision script's parts, or
// a script specialised for one rule (singleSource), which is all call.
func newFunction(head, call string) *redisFunction {
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
func (e *engine) fcall(ctx context.Context, fn *redisFunction, keys []string, args []any) (reply any, ok bool, err error) {
	reply, err = e.rdb.FCall(ctx, fn.name, keys, args...).Result()
	if err == nil || !isServerError(err) {
		return reply, true, err
	}
	if functionMissing(err) {
		if err := e.loadFunction(ctx, fn, keys[0]); err != nil {
			if !isServerError(err) {
				return nil, true, err
			}
			// Not loaded: this call runs the script; and so do the
			// next ones where the server will never load it.
			if loadRefused(err) {
				e.noFunctions.Store(true)
			}
			return nil, false, nil
		}
		reply, err = e.rdb.FCall(ctx, fn.name, keys, args...).Result()
		if err == nil || !isServerError(err) {
			return reply, true, err
		}
		if functionMissing(err) {
			// The key moved to another node meanwhile (or, through
			// an AutoPipeliner over a cluster, the library went to
			// another node): this call runs the script, and the next
			// loads the library again.
			return nil, false, nil
		}
	}
	switch {
	case functionsRefused(err):
		e.noFunctions.Store(true)
		return nil, false, nil
	case refusedBeforeRunning(err):
		return nil, false, nil
	}
	return reply, true, err
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
