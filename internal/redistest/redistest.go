// Package redistest runs real redis-server processes for tests: single
// servers, Redis Clusters, and a small TCP proxy that injects network faults.
//
// Every server is a child process started without --daemonize, bound to
// 127.0.0.1 on a port chosen at run time, with persistence off
// (--save "" --appendonly no) and its own temporary directory, which holds
// its log (redis.log), its stderr (stderr.log) and, for cluster nodes, its
// nodes.conf. Servers are stopped by signalling the process that was started
// and waiting for it, never by name.
//
// Ports are picked at random below the kernel's ephemeral port range (read
// from /proc/sys/net/ipv4/ip_local_port_range), so an outgoing connection can
// never hold the port of a killed server while a test restarts it; a port
// that is found busy is replaced by another one.
//
// The package needs redis-server (and redis-cli for clusters) on the PATH.
// Tests call [Require] or [SkipOrFail], which skip when they are missing,
// or fail when the environment variable REDLIMIT_REQUIRE_REDIS is "1".
package redistest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotInstalled reports that redis-server (or, for clusters, redis-cli)
// is not on the PATH.
var ErrNotInstalled = errors.New("redistest: redis-server or redis-cli not found on PATH")

// RequireEnv is the environment variable that turns skips for a missing
// Redis into failures when it is set to "1".
const RequireEnv = "REDLIMIT_REQUIRE_REDIS"

// lookPath reports ErrNotInstalled, wrapped with the missing program's name,
// when one of progs is not on the PATH.
func lookPath(progs ...string) error {
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrNotInstalled, p, err)
		}
	}
	return nil
}

// Require skips the test when redis-server is not on the PATH, or fails it
// when the environment variable REDLIMIT_REQUIRE_REDIS is "1".
func Require(tb testing.TB) {
	tb.Helper()
	SkipOrFail(tb, lookPath("redis-server"))
}

// SkipOrFail is for errors returned by [StartServer] and [StartCluster],
// typically started in TestMain or shared between tests. It does nothing when
// err is nil. When err wraps [ErrNotInstalled] it skips the test, or fails it
// if REDLIMIT_REQUIRE_REDIS is "1". Any other error fails the test.
func SkipOrFail(tb testing.TB, err error) {
	tb.Helper()
	switch {
	case err == nil:
	case errors.Is(err, ErrNotInstalled) && os.Getenv(RequireEnv) != "1":
		tb.Skipf("%v (set %s=1 to make this a failure)", err, RequireEnv)
	default:
		tb.Fatal(err)
	}
}

// TunedOptions returns the go-redis client options recommended for a rate
// limiter talking to the server at addr: 100 ms dial, read, write and pool
// timeouts, no command retries (MaxRetries -1), a single dial attempt
// (DialerRetries 1), context deadlines honoured (ContextTimeoutEnabled) and a
// pool of 20 connections. A failure then surfaces within about 100 ms instead
// of the defaults' 5-10 s.
func TunedOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		DialTimeout:           100 * time.Millisecond,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		PoolTimeout:           100 * time.Millisecond,
		MaxRetries:            -1,
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
		PoolSize:              20,
	}
}

// TunedClusterOptions is [TunedOptions] for a cluster client seeded with
// addrs. It also sets ClusterStateReloadInterval to 1 s: go-redis otherwise
// keeps sending a failed-over slot to the dead master for up to 60 s, since a
// refused connection does not trigger a topology reload. MaxRedirects keeps
// its default (3).
func TunedClusterOptions(addrs []string) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs:                      append([]string(nil), addrs...),
		DialTimeout:                100 * time.Millisecond,
		ReadTimeout:                100 * time.Millisecond,
		WriteTimeout:               100 * time.Millisecond,
		PoolTimeout:                100 * time.Millisecond,
		MaxRetries:                 -1,
		DialerRetries:              1,
		ContextTimeoutEnabled:      true,
		PoolSize:                   20,
		ClusterStateReloadInterval: time.Second,
	}
}

// Ports handed out by this process are never handed out again, so two
// servers or proxies of one test binary cannot race for the same port.
var ports struct {
	sync.Mutex
	used map[int]bool
}

// ephemeralLow returns the lowest port of the kernel's ephemeral range, or 0
// if it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return n
}

// portFree reports whether a listener can be opened on 127.0.0.1:port now.
func portFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// freePort returns a loopback port that is free now and was not handed out
// before by this process. With bus, port+10000 (the cluster bus port) is free
// too. Ports are taken below the ephemeral range when it leaves room;
// otherwise the kernel picks one.
func freePort(bus bool) (int, error) {
	ports.Lock()
	defer ports.Unlock()
	if ports.used == nil {
		ports.used = make(map[int]bool)
	}
	ok := func(p int) bool {
		if p <= 0 || ports.used[p] || !portFree(p) {
			return false
		}
		if bus && (p+10000 > 65535 || ports.used[p+10000] || !portFree(p+10000)) {
			return false
		}
		return true
	}
	take := func(p int) int {
		ports.used[p] = true
		if bus {
			ports.used[p+10000] = true
		}
		return p
	}
	// Candidates in [lo, hi) keep port (and port+10000) below the ephemeral range.
	lo, hi := 10000, ephemeralLow()
	if bus {
		hi -= 10000
	}
	if hi-lo >= 1000 {
		for range 200 {
			if p := lo + rand.IntN(hi-lo); ok(p) {
				return take(p), nil
			}
		}
	}
	for range 200 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("redistest: pick a port: %w", err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if ok(p) {
			return take(p), nil
		}
	}
	return 0, errors.New("redistest: no free loopback port found")
}
