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
// or fail when the environment variable REDLIMIT_REQUIRE_REDIS is "1". Both
// mark the test as one that starts a server (see internal/testlane), so
// that test.sh runs it in the lane of such tests.
//
// The environment variable REDLIMIT_REDIS_SERVER runs another engine: the
// path of a redis-server compatible program, such as Redis 6.0, Redis 8.0
// or Valkey, or a wrapper that starts one (.ci/engines.sh writes them).
// [ServerVersion] tells which engine the tests run on.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/testlane"
)

// ErrNotInstalled reports that redis-server (or, for clusters, redis-cli)
// is not on the PATH.
var ErrNotInstalled = errors.New("redistest: redis-server or redis-cli not found on PATH")

// RequireEnv is the environment variable that turns skips for a missing
// Redis into failures when it is set to "1".
const RequireEnv = "REDLIMIT_REQUIRE_REDIS"

// ServerEnv is the environment variable that names the server program the
// package starts, for single servers and cluster nodes: a path, or a name
// looked up in the PATH. The default is redis-server. The program gets
// redis-server's command line, so a shell script that execs another server
// with "$@" works; it must exec it, not fork it, because the package
// signals the process it started.
const ServerEnv = "REDLIMIT_REDIS_SERVER"

// CLIEnv is the environment variable that names the redis-cli program used
// by [Server.CLI] and to create clusters. The default is the redis-cli in the
// directory of $REDLIMIT_REDIS_SERVER, when that is a path and that
// directory has one, and otherwise redis-cli from the PATH.
const CLIEnv = "REDLIMIT_REDIS_CLI"

// serverPath returns the absolute path of the server program.
func serverPath() (string, error) {
	return program(ServerEnv, "redis-server")
}

// cliPath returns the absolute path of the redis-cli program.
func cliPath() (string, error) {
	if os.Getenv(CLIEnv) == "" {
		if srv := os.Getenv(ServerEnv); strings.ContainsRune(srv, filepath.Separator) {
			beside := filepath.Join(filepath.Dir(srv), "redis-cli")
			if _, err := exec.LookPath(beside); err == nil {
				return filepath.Abs(beside)
			}
		}
	}
	return program(CLIEnv, "redis-cli")
}

// program resolves the program named by the environment variable env, or
// def when env is unset. A default missing from the PATH is ErrNotInstalled,
// so tests skip; a program that env names and that cannot be run is another
// error, so they fail: the run asked for that engine.
func program(env, def string) (string, error) {
	name := os.Getenv(env)
	if name == "" {
		p, err := exec.LookPath(def)
		if err != nil {
			return "", fmt.Errorf("%w: %s: %v", ErrNotInstalled, def, err)
		}
		return filepath.Abs(p)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("redistest: %s=%s: %w", env, name, err)
	}
	// Absolute, because servers run in their own directory.
	return filepath.Abs(p)
}

// Require skips the test when redis-server is not on the PATH, or fails it
// when the environment variable REDLIMIT_REQUIRE_REDIS is "1". It fails the
// test when REDLIMIT_REDIS_SERVER names a program that cannot be run.
func Require(tb testing.TB) {
	tb.Helper()
	testlane.MarkServer(tb)
	_, err := serverPath()
	SkipOrFail(tb, err)
}

// Version is a server program's name and version, as its --version prints
// them ("Redis server v=6.0.16 ..." is {"Redis", 6, 0, 16}).
type Version struct {
	// Name is "Redis" or "Valkey".
	Name                string
	Major, Minor, Patch int
}

// String returns the name and version, for example "Valkey 8.1.1".
func (v Version) String() string {
	return fmt.Sprintf("%s %d.%d.%d", v.Name, v.Major, v.Minor, v.Patch)
}

// AtLeast reports whether v is version major.minor or later. Valkey numbers
// its own releases: Valkey 7.2 is Redis 7.2, and Valkey 8 has Redis 7.2's
// commands and more, not Redis 8's.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

var versions struct {
	sync.Mutex
	byPath map[string]Version
}

var versionRE = regexp.MustCompile(`^(\w+) server v=(\d+)\.(\d+)\.(\d+)`)

// ServerVersion returns the version of the server program the package
// starts (redis-server, or $REDLIMIT_REDIS_SERVER), for a test that must
// tell engines apart. It runs the program with --version once per program.
// The error wraps [ErrNotInstalled] when redis-server is not on the PATH.
func ServerVersion() (Version, error) {
	path, err := serverPath()
	if err != nil {
		return Version{}, err
	}
	versions.Lock()
	defer versions.Unlock()
	if v, ok := versions.byPath[path]; ok {
		return v, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return Version{}, fmt.Errorf("redistest: %s --version: %w", path, err)
	}
	v, err := parseVersion(string(out))
	if err != nil {
		return Version{}, fmt.Errorf("redistest: %s --version: %w", path, err)
	}
	if versions.byPath == nil {
		versions.byPath = make(map[string]Version)
	}
	versions.byPath[path] = v
	return v, nil
}

// parseVersion reads the output of redis-server --version.
func parseVersion(out string) (Version, error) {
	m := versionRE.FindStringSubmatch(out)
	if m == nil {
		return Version{}, fmt.Errorf("unexpected output %q", strings.TrimSpace(out))
	}
	v := Version{Name: m[1]}
	v.Major, _ = strconv.Atoi(m[2])
	v.Minor, _ = strconv.Atoi(m[3])
	v.Patch, _ = strconv.Atoi(m[4])
	return v, nil
}

// SkipOrFail is for errors returned by [StartServer] and [StartCluster],
// typically started in TestMain or shared between tests. It does nothing when
// err is nil. When err wraps [ErrNotInstalled] it skips the test, or fails it
// if REDLIMIT_REQUIRE_REDIS is "1". Any other error fails the test.
func SkipOrFail(tb testing.TB, err error) {
	tb.Helper()
	testlane.MarkServer(tb)
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
	_ = ln.Close() // it was free: that is the answer
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
		_ = ln.Close() // only its port was wanted
		if ok(p) {
			return take(p), nil
		}
	}
	return 0, errors.New("redistest: no free loopback port found")
}
