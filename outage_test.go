package redlimit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/outage"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testlane"
)

// dialCounter counts the connections a client dials.
type dialCounter struct{ n atomic.Int64 }

func (d *dialCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.n.Add(1)
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// waitTransitions waits until tr has recorded at least n transitions, or
// for d, and returns them.
func waitTransitions(t testing.TB, tr *transitions, n int, d time.Duration) []Transition {
	t.Helper()
	deadline := time.Now().Add(d)
	for len(tr.list()) < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return tr.list()
}

// The errors go-redis v9.23 gives when it cannot reach Redis, beyond the
// network's own, are outages: some concern the whole node, some may
// concern one call only.
func TestOutageErrors(t *testing.T) {
	// Error replies as go-redis parses them, from a miniredis told to
	// answer every command with one.
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	defer rdb.Close()
	redisReply := func(msg string) error {
		m.SetError(msg)
		defer m.SetError("")
		err := rdb.Get(context.Background(), "k").Err()
		require.Error(t, err)
		var reply redis.Error
		require.ErrorAs(t, err, &reply)
		return err
	}
	tests := []struct {
		name string
		err  error
		want outage.Kind
	}{
		// Ring: every shard marked down by the heartbeat.
		{"ring shards down", errors.New("redis: all ring shards are down"), outage.Node},
		{"cluster has no nodes", errors.New("redis: cluster has no nodes"), outage.Node},
		{"sentinels unreachable", errors.New("redis: all sentinels specified in configuration are unreachable"), outage.Node},
		{"sentinels unreachable, wrapped", fmt.Errorf("redis: all sentinels specified in configuration are unreachable: %w",
			errors.Join(errors.New("x"))), outage.Node},
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, outage.Node},
		{"dial timeout", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, outage.Node},
		{"LOADING", redisReply("LOADING Redis is loading the dataset in memory"), outage.Node},
		{"CLUSTERDOWN", redisReply("CLUSTERDOWN The cluster is down"), outage.Node},
		{"BUSY", redisReply("BUSY Redis is busy running a script."), outage.Node},
		{"MISCONF", redisReply("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."), outage.Node},
		// Redis 6.0.16's replies when a script's write is refused.
		{"script's OOM", redisReply("ERR Error running script (call to f_ac7fbb1c12893c1e157bffc3eba320beb55c4860): @user_script:1: @user_script: 1: -OOM command not allowed when used memory > 'maxmemory'."), outage.Node},
		{"script's MISCONF", redisReply("ERR Error running script (call to f_ac7fbb1c12893c1e157bffc3eba320beb55c4860): @user_script:1: @user_script: 1: -MISCONF Redis is configured to save RDB snapshots, but it is currently not able to persist on disk."), outage.Node},

		{"autopipeline timeout", redis.ErrAutoPipelineTimeout, outage.Call},
		{"autopipeline queue full", redis.ErrAutoPipelineQueueFull, outage.Call},
		{"connection unusable", errors.New("redis: timed out trying to mark connection as unusable"), outage.Call},
		{"full-duplex reader gone", errors.New("redis: autopipeline full-duplex reader exited"), outage.Call},
		{"read timeout", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, outage.Call},
		{"EOF", io.EOF, outage.Call},
		{"closed pipe (a custom dialer's net.Pipe)", io.ErrClosedPipe, outage.Call},
		{"pool timeout", redis.ErrPoolTimeout, outage.Call},
		{"node closed", redis.ErrClosed, outage.Call},
		{"TRYAGAIN", redisReply("TRYAGAIN Multiple keys request during rehashing of slot"), outage.Call},
		{"ASK", redisReply("ASK 7346 127.0.0.1:7001"), outage.Call},
		{"MOVED", redisReply("MOVED 7346 127.0.0.1:7001"), outage.Call},

		{"script error", redisReply("ERR user_script:1: bad argument"), outage.None},
		{"script's WRONGTYPE", redisReply("ERR Error running script (call to f_ac7fbb1c12893c1e157bffc3eba320beb55c4860): @user_script:1: @user_script: 1: -WRONGTYPE Operation against a key holding the wrong kind of value"), outage.None},
		{"CROSSSLOT", redis.ErrCrossSlot, outage.None},
		{"wrong type", redisReply("WRONGTYPE Operation against a key holding the wrong kind of value"), outage.None},
		{"cancelled", context.Canceled, outage.None},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, outage.Classify(tt.err), "outage.Classify(%v)", tt.err)
			assert.Equal(t, tt.want != outage.None, outage.Is(tt.err), "outage.Is(%v)", tt.err)
		})
	}
}

// crashTarget is one client type for the crash test: its client, and how
// to crash and restart the server(s) that hold the test key.
type crashTarget struct {
	rdb     redis.UniversalClient
	kill    func() error
	restart func() error
	// down waits, after the kill, until the client itself has noticed
	// (the ring's heartbeat); nil when there is nothing to wait for.
	down func()
}

// Each client type: SIGKILL the server that holds the key; calls get
// fallback decisions with no error; after a restart they come back to
// Redis. The ring case waits for the ring's heartbeat to mark its shard
// down first, when go-redis answers "redis: all ring shards are down".
func TestCrashEachClient(t *testing.T) {
	testlane.MarkAlone(t)
	targets := []struct {
		name  string
		start func(t *testing.T) crashTarget
	}{
		{"Client", func(t *testing.T) crashTarget {
			srv := redistest.Start(t)
			return crashTarget{rdb: tunedClient(t, srv.Addr), kill: srv.Kill, restart: srv.Restart}
		}},
		{"ClusterClient", func(t *testing.T) crashTarget {
			c, err := redistest.StartCluster(3, 0, "--cluster-require-full-coverage", "no")
			redistest.SkipOrFail(t, err)
			t.Cleanup(c.Close)
			rdb := clusterClient(t, c, time.Second)
			m, err := c.MasterOf(redistest.Slot("redlimit:{crash}:x"))
			require.NoError(t, err)
			return crashTarget{rdb: rdb, kill: m.Kill, restart: m.Restart}
		}},
		{"Ring", func(t *testing.T) crashTarget {
			srv := redistest.Start(t)
			o := redistest.TunedOptions(srv.Addr)
			ring := redis.NewRing(&redis.RingOptions{
				Addrs:              map[string]string{"a": srv.Addr},
				HeartbeatFrequency: 100 * time.Millisecond,
				DialTimeout:        o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
				PoolTimeout: o.PoolTimeout, MaxRetries: o.MaxRetries, DialerRetries: o.DialerRetries,
				ContextTimeoutEnabled: true,
			})
			t.Cleanup(func() { ring.Close() })
			return crashTarget{rdb: ring, kill: srv.Kill, restart: srv.Restart, down: func() {
				require.Eventually(t, func() bool { return ring.Len() == 0 }, 5*time.Second, 10*time.Millisecond,
					"the ring's heartbeat never marked its shard down")
			}}
		}},
		{"FailoverClient", func(t *testing.T) crashTarget {
			master := redistest.Start(t)
			sentinel := startSentinel(t, master.Port)
			o := redistest.TunedOptions(master.Addr)
			rdb := redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName:    sentinelMaster,
				SentinelAddrs: []string{sentinel},
				DialTimeout:   o.DialTimeout, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout,
				PoolTimeout: o.PoolTimeout, MaxRetries: o.MaxRetries, DialerRetries: o.DialerRetries,
				ContextTimeoutEnabled: true,
			})
			t.Cleanup(func() { rdb.Close() })
			return crashTarget{rdb: rdb, kill: master.Kill, restart: master.Restart}
		}},
		{"AutoPipeliner", func(t *testing.T) crashTarget {
			srv := redistest.Start(t)
			ap, err := tunedClient(t, srv.Addr).AutoPipeline()
			require.NoError(t, err)
			return crashTarget{rdb: ap, kill: srv.Kill, restart: srv.Restart}
		}},
	}
	for _, tt := range targets {
		t.Run(tt.name, func(t *testing.T) {
			ct := tt.start(t)
			var tr transitions
			lim := newLimiter(t, ct.rdb, TokenBucket, PerSecond(1000), WithOnTransition(tr.record))
			ctx := context.Background()
			const key = "crash"
			res, err := lim.Allow(ctx, key)
			require.NoError(t, err)
			require.False(t, res.Degraded, "before the crash")

			require.NoError(t, ct.kill())
			if ct.down != nil {
				ct.down()
			}
			for i := range 20 {
				res, err := lim.Allow(ctx, key)
				require.NoError(t, err, "call %d after the kill", i)
				require.True(t, res.Degraded, "call %d after the kill", i)
			}
			got := waitTransitions(t, &tr, 1, time.Second)
			require.NotEmpty(t, got)
			assert.True(t, got[0].Down)
			t.Logf("down: %v", got[0].Err)

			require.NoError(t, ct.restart())
			start := time.Now()
			for {
				res, err := lim.Allow(ctx, key)
				require.NoError(t, err)
				if !res.Degraded {
					break
				}
				require.Less(t, time.Since(start), 5*time.Second, "still degraded 5s after the restart")
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("%s: back on Redis %v after the restart", tt.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

const sentinelMaster = "redlimit"

// startSentinel starts a Redis Sentinel (redis-server --sentinel) that
// monitors the master on 127.0.0.1:masterPort, and returns its address. It
// is stopped by its pid when the test ends.
func startSentinel(t *testing.T, masterPort int) string {
	t.Helper()
	dir := t.TempDir()
	for attempt := 0; ; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		conf := filepath.Join(dir, "sentinel.conf")
		require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(
			"port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\n",
			port, dir, sentinelMaster, masterPort, sentinelMaster)), 0o600))
		cmd := exec.Command("redis-server", conf, "--sentinel", "--logfile", filepath.Join(dir, "sentinel.log"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		require.NoError(t, cmd.Start())
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }() // killed: an error, as expected
		stop := func() {
			_ = cmd.Process.Kill()
			<-done
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if sentinelReady(addr, done) {
			t.Cleanup(stop)
			return addr
		}
		stop()
		if attempt == 4 {
			log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Fatalf("sentinel did not start:\n%s", log)
		}
	}
}

// sentinelReady waits up to 5 s until the sentinel at addr knows the master.
func sentinelReady(addr string, exited <-chan struct{}) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond)) // a failure shows as the read's error
			fmt.Fprintf(c, "SENTINEL get-master-addr-by-name %s\r\n", sentinelMaster)
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err == nil && strings.HasPrefix(line, "*2") {
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// Transitions are reported one at a time, in the order of the switches:
// for one node, Down and back alternate, even when the switches come
// faster than a hook runs. Redis is cut off and restored every 2 to 12
// milliseconds, probed every 100µs, under load, and the hook takes up to
// 0.5ms.
func TestTransitionsOrdered(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	o := redistest.TunedOptions(proxy.Addr)
	o.PoolSize = 10_000 // no dial breaker: it would hold every dial for a second
	rdb := redis.NewClient(o)
	defer rdb.Close()
	var (
		got      recorder[Transition]
		inHook   atomic.Int32
		overlaps atomic.Int32
	)
	hook := func(tr Transition) {
		if inHook.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
		got.record(tr)
		inHook.Add(-1)
	}
	lim := newLimiter(t, rdb, TokenBucket, PerSecond(100_000), WithPingInterval(100*time.Microsecond), WithOnTransition(hook))
	ld := startLoad(lim, 8)
	// Until 100 switches, or 10 s on a slow machine.
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && len(got.list()) < 100; {
		proxy.Cut()
		time.Sleep(time.Duration(2+rand.IntN(10)) * time.Millisecond)
		proxy.Restore()
		time.Sleep(time.Duration(2+rand.IntN(10)) * time.Millisecond)
	}
	r := report(ld.finish(), 0, 0)
	require.NoError(t, lim.Close())
	list := got.list()
	t.Logf("%d transitions; %v", len(list), r)
	assert.Zero(t, r.errors, "errors returned to callers, first %v", r.firstErr)
	assert.Zero(t, overlaps.Load(), "hook calls overlapped")
	require.Greater(t, len(list), 20, "too few transitions to tell")
	for i, tr := range list {
		if tr.Down != (i%2 == 0) {
			t.Fatalf("transition %d of %d is Down=%v, want the switches alternating from a Down: %+v", i, len(list), tr.Down, list[max(0, i-2):min(len(list), i+2)])
		}
	}
}

// While a node refuses connections, its probes back off: go-redis dials
// (and logs "failed to dial") about 7 times in 2 s, not every ping interval;
// and the node is used again soon after it comes back.
func TestProbeBackoff(t *testing.T) {
	testlane.MarkAlone(t)
	srv := redistest.Start(t)
	var dials dialCounter
	o := redistest.TunedOptions(srv.Addr)
	o.Dialer = dials.dial
	rdb := redis.NewClient(o)
	defer rdb.Close()
	lim := newLimiter(t, rdb, TokenBucket, PerSecond(1000))
	ctx := context.Background()
	_, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, srv.Kill())
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Degraded)
	before := dials.n.Load()
	time.Sleep(2 * time.Second)
	n := dials.n.Load() - before
	t.Logf("%d dials in 2 s while the node refused connections (ping interval 100ms)", n)
	// Probes 100, 200, 300, 300...ms apart: 7, and one of slack.
	assert.LessOrEqual(t, n, int64(8))

	require.NoError(t, srv.Restart())
	start := time.Now()
	require.Eventually(t, func() bool {
		res, err := lim.Allow(ctx, "k")
		return err == nil && !res.Degraded
	}, 3*time.Second, 5*time.Millisecond)
	back := time.Since(start)
	t.Logf("back on Redis %v after the restart", back.Round(time.Millisecond))
	// At most 300ms (three ping intervals) to the next probe, and one more.
	assert.Less(t, back, time.Second)
}
