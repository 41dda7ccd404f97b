package redistest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// TestMain fails the run if a goroutine or a redis-server child outlives the
// tests.
func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		if err := checkLeaks(before); err != nil {
			fmt.Fprintln(os.Stderr, "leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func checkLeaks(goroutines int) error {
	// go-redis ends its background dial probe within 1 s of Close.
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > goroutines {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			return fmt.Errorf("%d goroutines, %d before the tests:\n%s",
				runtime.NumGoroutine(), goroutines, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
	if kids := redisChildren(); len(kids) > 0 {
		return fmt.Errorf("redis-server children still running: %v", kids)
	}
	return nil
}

// redisChildren lists the redis-server processes whose parent is this test
// binary (zombies included).
func redisChildren() []string {
	self := strconv.Itoa(os.Getpid())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var kids []string
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || !strings.Contains(s[:i], "(redis-server") {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == self {
			kids = append(kids, s[:i+1]+" "+f[0])
		}
	}
	return kids
}

// gone reports whether pid no longer exists (not even as a zombie).
func gone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// pingSoon pings until it succeeds, at most n times: after a fault, each
// pooled connection may fail once before a new one is dialled.
func pingSoon(ctx context.Context, rdb *redis.Client, n int) error {
	var err error
	for range n {
		if err = rdb.Ping(ctx).Err(); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// refusedSoon pings until the error is "connection refused", at most n times.
func refusedSoon(ctx context.Context, rdb *redis.Client, n int) error {
	var err error
	for range n {
		err = rdb.Ping(ctx).Err()
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil
		}
	}
	return fmt.Errorf("got %v, want connection refused", err)
}

func tunedClient(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(redistest.TunedOptions(addr))
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func TestSlotKnownValues(t *testing.T) {
	for _, tt := range []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3}, // the CRC-16/XMODEM check value
		{"foo", 12182},
		{"bar", 5061},
		{"user42", 14710},
		{"rl:{user42}:cnt", 14710},
		{"{user42}", 14710},
	} {
		got := redistest.Slot(tt.key)
		assert.Equal(t, tt.want, got, "Slot(%q) = %d, want %d", tt.key, got, tt.want)
	}
}

// Not parallel, as TestProxy: the killed server's port is free until the
// restart, and a parallel test's server could take it.
func TestServerKillRestart(t *testing.T) {
	ctx := context.Background()
	t0 := time.Now()
	s := redistest.Start(t)
	t.Logf("server start: %v", time.Since(t0))
	want := "127.0.0.1:" + strconv.Itoa(s.Port)
	require.Equal(t, want, s.Addr, "Addr = %q, want %q", s.Addr, want)
	rdb := tunedClient(t, s.Addr)
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())

	pid := s.PID()
	require.NoError(t, s.Kill())
	got := s.PID()
	assert.Zero(t, got, "PID after Kill = %d, want 0", got)
	assert.True(t, gone(pid), "process %d still exists after Kill", pid)
	assert.NoError(t, refusedSoon(ctx, rdb, 3))

	port := s.Port
	t0 = time.Now()
	require.NoError(t, s.Restart())
	t.Logf("restart: %v", time.Since(t0))
	assert.Equal(t, port, s.Port, "after Restart: port %d pid %d, want port %d and a new pid", s.Port, s.PID(), port)
	assert.NotZero(t, s.PID(), "after Restart: port %d pid %d, want port %d and a new pid", s.Port, s.PID(), port)
	assert.NotEqual(t, pid, s.PID(), "after Restart: port %d pid %d, want port %d and a new pid", s.Port, s.PID(), port)
	err := pingSoon(ctx, rdb, 3)
	require.NoError(t, err, "tuned client after restart: %v", err)
	err = s.Client(t).Get(ctx, "k").Err()
	assert.ErrorIs(t, err, redis.Nil, "GET k after restart: got %v, want redis.Nil (data gone)", err)
	assert.Error(t, s.Restart(), "Restart of a running server: got nil error")
}

func TestServerArgsAndCLI(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, "--maxmemory", "2mb")
	for _, tt := range []struct{ param, want string }{
		{"maxmemory", "2097152"},
		{"save", ""},
		{"appendonly", "no"},
		{"bind", "127.0.0.1"},
		{"daemonize", "no"},
		{"port", strconv.Itoa(s.Port)},
	} {
		got, err := s.CLI("CONFIG", "GET", tt.param)
		require.NoError(t, err)
		want := strings.TrimSpace(tt.param + "\n" + tt.want)
		assert.Equal(t, want, got, "CONFIG GET %s = %q, want %q", tt.param, got, want)
	}
	_, err := s.CLI("NOSUCHCOMMAND")
	assert.Error(t, err, "CLI(NOSUCHCOMMAND): got nil error")
	_, err = os.Stat(filepath.Join(s.Dir, "redis.log"))
	assert.NoError(t, err, "log file: %v", err)
}

func TestServerCloseIdempotent(t *testing.T) {
	t.Parallel()
	s, err := redistest.StartServer()
	redistest.SkipOrFail(t, err)
	defer s.Close()
	pid := s.PID()
	require.NoError(t, s.Close())
	err = s.Close()
	require.NoError(t, err, "second Close: %v", err)
	assert.Zero(t, s.PID(), "after Close: PID() = %d, process %d gone = %v", s.PID(), pid, gone(pid))
	assert.True(t, gone(pid), "after Close: PID() = %d, process %d gone = %v", s.PID(), pid, gone(pid))
	_, err = os.Stat(s.Dir)
	assert.True(t, os.IsNotExist(err), "Dir after Close: got %v, want not exist", err)
	err = s.Restart()
	require.NoError(t, err, "Restart after Close: %v", err)
	got, err := s.CLI("PING")
	assert.NoError(t, err, "PING after Restart: %q, %v", got, err)
	assert.Equal(t, "PONG", got, "PING after Restart: %q, %v", got, err)
}

func TestServerPauseResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := tunedClient(t, s.Addr)
	require.NoError(t, rdb.Ping(ctx).Err())
	require.NoError(t, s.Pause())
	t0 := time.Now()
	err := rdb.Ping(ctx).Err()
	d := time.Since(t0)
	assert.True(t, isTimeout(err), "PING on a paused server: got %v after %v, want a timeout after about 100ms", err, d)
	assert.LessOrEqual(t, d, time.Second, "PING on a paused server: got %v after %v, want a timeout after about 100ms", err, d)
	err = tunedClient(t, s.Addr).Ping(ctx).Err()
	assert.True(t, isTimeout(err), "new client on a paused server: got %v, want a timeout", err)
	require.NoError(t, s.Resume())
	err = pingSoon(ctx, rdb, 3)
	assert.NoError(t, err, "PING after Resume: %v", err)
	// Close must stop a paused server too.
	require.NoError(t, s.Pause())
}

// Not parallel: after Cut, the proxy's port is free, and a server that a
// parallel test started took it once (CI on Redis 6.0: the dial after Cut
// connected).
func TestProxy(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	p := redistest.NewProxy(t, s.Addr)
	rdb := tunedClient(t, p.Addr)
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())

	p.Cut()
	_, err := net.DialTimeout("tcp", p.Addr, time.Second)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "dial after Cut: got %v, want connection refused", err)
	err = refusedSoon(ctx, rdb, 3)
	assert.NoError(t, err, "after Cut: %v", err)
	addr := p.Addr
	p.Restore()
	assert.Equal(t, addr, p.Addr, "Addr after Restore = %s, want %s", p.Addr, addr)
	err = pingSoon(ctx, rdb, 3)
	require.NoError(t, err, "after Restore: %v", err)

	p.Blackhole(true)
	t0 := time.Now()
	err = rdb.Ping(ctx).Err()
	d := time.Since(t0)
	assert.True(t, isTimeout(err), "black hole: got %v after %v, want a timeout after about 100ms", err, d)
	assert.LessOrEqual(t, d, time.Second, "black hole: got %v after %v, want a timeout after about 100ms", err, d)
	assert.Contains(t, fmt.Sprint(err), "i/o timeout", "black hole: got %v, want i/o timeout", err)
	p.Blackhole(false)
	err = pingSoon(ctx, rdb, 3)
	require.NoError(t, err, "after Blackhole(false): %v", err)

	p.SetDelay(150 * time.Millisecond)
	t0 = time.Now()
	err = rdb.Get(ctx, "k").Err()
	d = time.Since(t0)
	assert.True(t, isTimeout(err), "delay 150ms: got %v after %v, want a timeout after about 100ms", err, d)
	assert.LessOrEqual(t, d, time.Second, "delay 150ms: got %v after %v, want a timeout after about 100ms", err, d)
	p.SetDelay(30 * time.Millisecond)
	err = pingSoon(ctx, rdb, 3) // dials a new connection
	require.NoError(t, err, "delay 30ms: %v", err)
	t0 = time.Now()
	v, err := rdb.Get(ctx, "k").Result()
	d = time.Since(t0)
	assert.NoError(t, err, "delay 30ms: GET = %q, %v after %v, want \"v\" after at least 30ms", v, err, d)
	assert.Equal(t, "v", v, "delay 30ms: GET = %q, %v after %v, want \"v\" after at least 30ms", v, err, d)
	assert.GreaterOrEqual(t, d, 30*time.Millisecond, "delay 30ms: GET = %q, %v after %v, want \"v\" after at least 30ms", v, err, d)
	p.SetDelay(0)
	p.SetEachWay(20 * time.Millisecond)
	t0 = time.Now()
	err = rdb.Ping(ctx).Err()
	d = time.Since(t0)
	assert.NoError(t, err, "20ms each way: %v", err)
	assert.GreaterOrEqual(t, d, 40*time.Millisecond, "20ms each way: PING after %v, want at least 40ms", d)
	p.Restore()
	t0 = time.Now()
	err = rdb.Ping(ctx).Err()
	d = time.Since(t0)
	assert.NoError(t, err, "after Restore: %v after %v, want no delay", err, d)
	assert.LessOrEqual(t, d, 20*time.Millisecond, "after Restore: %v after %v, want no delay", err, d)
	p.Close()
	p.Close()
}

func TestCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Now()
	c, err := redistest.StartCluster(3, 1)
	redistest.SkipOrFail(t, err)
	t.Cleanup(c.Close)
	t.Logf("cluster 3+1 start: %v", time.Since(t0))

	require.Len(t, c.Masters, 3, "got %d masters, %d replicas, %d addrs; want 3, 3, 6", len(c.Masters), len(c.Replicas), len(c.Addrs()))
	require.Len(t, c.Replicas, 3, "got %d masters, %d replicas, %d addrs; want 3, 3, 6", len(c.Masters), len(c.Replicas), len(c.Addrs()))
	require.Len(t, c.Addrs(), 6, "got %d masters, %d replicas, %d addrs; want 3, 3, 6", len(c.Masters), len(c.Replicas), len(c.Addrs()))

	node := c.Masters[0].Client(t)
	for _, key := range []string{"user42", "{a}b", "a{}b", "{", "}", "名前", "", "}{x}", "{{a}b}", "a{b}{c}", "rl:{user42}:cnt", "\xff\xfe{\x00}", strings.Repeat("x", 10000)} {
		want, err := node.ClusterKeySlot(ctx, key).Result()
		require.NoError(t, err)
		got := redistest.Slot(key)
		assert.Equal(t, want, int64(got), "Slot(%q) = %d, want %d (CLUSTER KEYSLOT)", key, got, want)
	}

	// MasterOf and ReplicaOf agree with CLUSTER NODES.
	text, err := node.ClusterNodes(ctx).Result()
	require.NoError(t, err)
	type entry struct{ id, flags, master string }
	byAddr := map[string]entry{}
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		addr, _, _ := strings.Cut(f[1], "@")
		byAddr[addr] = entry{f[0], f[2], f[3]}
		if !strings.Contains(f[2], "master") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			for _, slot := range []string{lo, hi} {
				n, _ := strconv.Atoi(slot)
				m, err := c.MasterOf(n)
				if assert.NoError(t, err, "MasterOf(%d) = %v, %v; want %s", n, m, err, addr) {
					assert.Equal(t, addr, m.Addr, "MasterOf(%d) = %v, %v; want %s", n, m, err, addr)
				}
			}
		}
	}
	for i, m := range c.Masters {
		assert.Contains(t, byAddr[m.Addr].flags, "master", "Masters[%d] %s has flags %s", i, m.Addr, byAddr[m.Addr].flags)
		r, err := c.ReplicaOf(m)
		require.NoError(t, err)
		assert.Same(t, c.Replicas[i], r, "ReplicaOf(Masters[%d]) = %s, want Replicas[%d] = %s", i, r, i, c.Replicas[i])
		e := byAddr[r.Addr]
		assert.Contains(t, e.flags, "slave", "CLUSTER NODES for replica %s: flags %s master %s, want slave of %s", r, e.flags, e.master, byAddr[m.Addr].id)
		assert.Equal(t, byAddr[m.Addr].id, e.master, "CLUSTER NODES for replica %s: flags %s master %s, want slave of %s", r, e.flags, e.master, byAddr[m.Addr].id)
	}
	m0, _ := c.MasterOf(0)
	assert.Same(t, c.Masters[0], m0, "MasterOf(0) = %v, want Masters[0] %v", m0, c.Masters[0])

	// A tuned cluster client works, and hash tags decide CROSSSLOT.
	cc := redis.NewClusterClient(redistest.TunedClusterOptions(c.Addrs()))
	t.Cleanup(func() { cc.Close() })
	for i := range 50 {
		require.NoError(t, cc.Set(ctx, "key"+strconv.Itoa(i), i, 0).Err())
	}
	two := "return redis.call('SET', KEYS[1], 1) and redis.call('SET', KEYS[2], 1)"
	err = cc.Eval(ctx, two, []string{"rl:{u}:a", "rl:{u}:b"}).Err()
	assert.NoError(t, err, "two keys, one tag: %v", err)
	err = cc.Eval(ctx, two, []string{"rl:{}:a", "rl:{}:b"}).Err()
	if assert.Error(t, err, "two keys, empty tag: got %v, want CROSSSLOT", err) {
		assert.True(t, strings.HasPrefix(err.Error(), "CROSSSLOT"), "two keys, empty tag: got %v, want CROSSSLOT", err)
	}

	// Failover: kill the master of a slot; its replica takes over.
	slot := redistest.Slot("{a}k")
	m, err := c.MasterOf(slot)
	require.NoError(t, err)
	r, err := c.ReplicaOf(m)
	require.NoError(t, err)
	require.NoError(t, m.Kill())
	t0 = time.Now()
	require.NoError(t, c.WaitHealthy(20*time.Second))
	t.Logf("failover after SIGKILL of %s: healthy after %v", m, time.Since(t0))
	got, err := c.MasterOf(slot)
	assert.Same(t, r, got, "MasterOf(%d) after failover = %v, %v; want the replica %s", slot, got, err, r)
	t0 = time.Now()
	require.NoError(t, m.Restart())
	for {
		if got, err := c.ReplicaOf(r); err == nil && got == m {
			break
		}
		require.LessOrEqual(t, time.Since(t0), 15*time.Second, "restarted %s did not become a replica of %s", m, r)
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, c.WaitHealthy(10*time.Second))
	t.Logf("old master rejoined as a replica after %v", time.Since(t0))

	var pids []int
	for _, s := range append(c.Masters, c.Replicas...) {
		pids = append(pids, s.PID())
	}
	t0 = time.Now()
	c.Close()
	t.Logf("cluster close: %v", time.Since(t0))
	for _, pid := range pids {
		assert.True(t, gone(pid), "process %d still exists after Close", pid)
	}
}

// fakeTB records Skip and Fatal instead of stopping the test.
type fakeTB struct {
	testing.TB
	skipped, failed bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Skip(...any)           { f.skipped = true }
func (f *fakeTB) Skipf(string, ...any)  { f.skipped = true }
func (f *fakeTB) Fatal(...any)          { f.failed = true }
func (f *fakeTB) Fatalf(string, ...any) { f.failed = true }

func TestSkipOrFail(t *testing.T) {
	other := errors.New("boom")
	for _, tt := range []struct {
		name                string
		env                 string
		err                 error
		wantSkip, wantFatal bool
	}{
		{"nil", "1", nil, false, false},
		{"missing", "", fmt.Errorf("x: %w", redistest.ErrNotInstalled), true, false},
		{"missing required", "1", redistest.ErrNotInstalled, false, true},
		{"other", "", other, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(redistest.RequireEnv, tt.env)
			f := &fakeTB{TB: t}
			redistest.SkipOrFail(f, tt.err)
			assert.Equal(t, tt.wantSkip, f.skipped, "skipped %v failed %v, want %v %v", f.skipped, f.failed, tt.wantSkip, tt.wantFatal)
			assert.Equal(t, tt.wantFatal, f.failed, "skipped %v failed %v, want %v %v", f.skipped, f.failed, tt.wantSkip, tt.wantFatal)
		})
	}
}

func TestSingleNodeCluster(t *testing.T) {
	redistest.Require(t)
	c, err := redistest.StartCluster(1, 0)
	require.NoError(t, err)
	defer c.Close()
	rdb := redis.NewClusterClient(redistest.TunedClusterOptions(c.Addrs()))
	defer rdb.Close()
	ctx := context.Background()
	for _, k := range []string{"a", "b", "{user}x"} {
		err = rdb.Set(ctx, k, "1", 0).Err()
		require.NoError(t, err, "SET %s: %v", k, err)
	}
	m, err := c.MasterOf(redistest.Slot("b"))
	require.NoError(t, err, "MasterOf = %v, %v; want the only master", m, err)
	require.Same(t, c.Masters[0], m, "MasterOf = %v, %v; want the only master", m, err)
}

// TestServerVersion checks ServerVersion against what the running server
// says in INFO server (Valkey reports redis_version 7.2.4 for clients and its
// own version as valkey_version).
func TestServerVersion(t *testing.T) {
	t.Parallel()
	v, err := redistest.ServerVersion()
	redistest.SkipOrFail(t, err)
	t.Logf("engine: %v", v)
	s := redistest.Start(t)
	info, err := s.Client(t).Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	field := func(name string) string {
		for line := range strings.SplitSeq(info, "\r\n") {
			if k, val, ok := strings.Cut(line, ":"); ok && k == name {
				return val
			}
		}
		return ""
	}
	name, want := "Redis", field("redis_version")
	if vv := field("valkey_version"); vv != "" {
		name, want = "Valkey", vv
	}
	if got := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch); v.Name != name || got != want {
		t.Errorf("ServerVersion() = %v, INFO server says %s %s", v, name, want)
	}
}

// TestServerEnv runs the server through a wrapper script named by
// REDLIMIT_REDIS_SERVER, as .ci/engines.sh writes them, and checks that a
// missing program named there fails the test instead of skipping it.
func TestServerEnv(t *testing.T) {
	redistest.Require(t)
	defaultServer, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("the default redis-server is not on the PATH")
	}
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "redis-server")
	script := "#!/bin/sh\necho wrapped >&2\nexec " + defaultServer + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(redistest.ServerEnv, wrapper)

	s := redistest.Start(t)
	if got, err := s.CLI("PING"); err != nil || got != "PONG" {
		t.Fatalf("PING: %q, %v", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(s.Dir, "stderr.log")); err != nil || !strings.Contains(string(b), "wrapped") {
		t.Errorf("stderr.log = %q, %v; want the wrapper's line", b, err)
	}
	// The wrapper execs: the process started is the server, so Kill reaches it.
	pid := s.PID()
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if !gone(pid) {
		t.Errorf("process %d still there after Kill", pid)
	}
	if _, err := redistest.ServerVersion(); err != nil {
		t.Errorf("ServerVersion through the wrapper: %v", err)
	}

	t.Setenv(redistest.ServerEnv, filepath.Join(dir, "missing"))
	t.Setenv(redistest.RequireEnv, "")
	_, err = redistest.StartServer()
	if err == nil || errors.Is(err, redistest.ErrNotInstalled) {
		t.Errorf("StartServer with %s naming a missing program: got %v, want an error other than ErrNotInstalled", redistest.ServerEnv, err)
	}
	f := &fakeTB{TB: t}
	redistest.Require(f)
	if f.skipped || !f.failed {
		t.Errorf("Require with a missing %s: skipped %v failed %v, want a failure", redistest.ServerEnv, f.skipped, f.failed)
	}
}
