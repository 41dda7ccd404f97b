package redlimit

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// TestRetriedScriptCounts measures what go-redis's command retries do to a
// limiter: Redis runs the script, the reply is lost with the connection,
// and go-redis, which cannot tell whether the script ran, sends it again.
// The numbers are quoted in README.md ("Client options"), which is why it
// recommends MaxRetries -1 for a limiter's client: the fallback answers the
// failed call instead.
func TestRetriedScriptCounts(t *testing.T) {
	srv := redistest.Start(t) // its own: a SCRIPT FLUSH by another test would change the count
	const rate = 100
	limits := map[Strategy]Limit{
		FixedWindow: {Rate: rate, Period: MaxPeriod}, // the next window edge is in 2069
		TokenBucket: {Rate: rate, Period: time.Hour}, // refills 1 event in 36 s
	}
	cases := []struct {
		name       string
		maxRetries int // go-redis Options.MaxRetries; 0 means its default, 3
		drops      int // script replies the proxy drops, closing the connection
		late       bool
		counted    int // events Redis recorded for the one call
		attempts   int // scripts Redis ran
		degraded   bool
	}{
		{name: "MaxRetries -1, reply lost", maxRetries: -1, drops: 1, counted: 1, attempts: 1, degraded: true},
		{name: "MaxRetries 3, reply lost once", maxRetries: 3, drops: 1, counted: 2, attempts: 2},
		{name: "MaxRetries 0 (default 3), reply lost once", maxRetries: 0, drops: 1, counted: 2, attempts: 2},
		{name: "MaxRetries 3, every reply lost", maxRetries: 3, drops: 100, counted: 4, attempts: 4, degraded: true},
		{name: "MaxRetries 3, reply later than ReadTimeout", maxRetries: 3, late: true, counted: 1, attempts: 1, degraded: true},
	}
	ctx := context.Background()
	direct := srv.Client(t)
	for _, s := range []Strategy{FixedWindow, TokenBucket} {
		for _, tc := range cases {
			t.Run(s.String()+"/"+tc.name, func(t *testing.T) {
				l := limits[s]
				prefix := "retry" + t.Name()
				check := newLimiter(t, direct, s, l, WithPrefix(prefix))
				// Load the script (or library), so that the call below is one
				// EVALSHA (or FCALL).
				_, err := check.AllowN(ctx, "warm-up", 0)
				require.NoError(t, err)

				target := srv.Addr
				var slow *redistest.Proxy
				if tc.late {
					slow = redistest.NewProxy(t, srv.Addr)
					target = slow.Addr
				}
				d := newReplyDropper(t, target)
				d.drops.Store(int64(tc.drops))
				opts := redistest.TunedOptions(d.addr())
				opts.MaxRetries = tc.maxRetries
				if !tc.late {
					opts.ReadTimeout = 2 * time.Second // -race on 2 busy cores
				}
				rdb := redis.NewClient(opts)
				t.Cleanup(func() { rdb.Close() })
				// No periodic probes during the test (the dropper leaves out
				// the one probe that the lost reply sets off: see isProbe).
				// No eviction sampling either: its INFO at the start would
				// open a second connection, on which go-redis would retry.
				lim := newLimiter(t, rdb, s, l, WithPrefix(prefix), WithPingInterval(time.Hour), WithEvictionCheck(0))
				if tc.late {
					// Connect first: a late HELLO would fail the dial.
					require.NoError(t, rdb.Ping(ctx).Err())
					slow.SetDelay(300 * time.Millisecond)
				}

				res, err := lim.Allow(ctx, "k")
				require.NoError(t, err)
				attempts := d.scripts.Load()

				after, err := check.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				counted := rate - after.Remaining
				t.Logf("%d script runs, %d events counted; the caller got %+v", attempts, counted, res)
				assert.Equal(t, tc.attempts, int(attempts), "scripts Redis ran")
				assert.Equal(t, tc.counted, counted, "events Redis recorded for one Allow")
				assert.Equal(t, tc.degraded, res.Degraded, "answered by the fallback")
				assert.True(t, res.Allowed)
				if !res.Degraded {
					assert.Equal(t, rate-tc.counted, res.Remaining, "the caller's Remaining shows the double count")
				}
			})
		}
	}
}

// replyDropper is a TCP proxy that lets the first drops scripts (EVALSHA,
// EVAL or FCALL) reach Redis, then swallows the reply and closes the connection:
// the client sees EOF after Redis ran the script. It counts the scripts it
// forwards. The rescue's probes, scripts too, are forwarded but neither
// counted nor dropped: a lost reply has the node probed at once, on a
// goroutine of its own, which may or may not be done when the test reads
// the count.
type replyDropper struct {
	ln      net.Listener
	target  string
	drops   atomic.Int64 // script replies still to drop
	scripts atomic.Int64 // scripts forwarded
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func newReplyDropper(t *testing.T, target string) *replyDropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	d := &replyDropper{ln: ln, target: target}
	d.wg.Add(1)
	go d.accept()
	t.Cleanup(d.close)
	return d
}

func (d *replyDropper) addr() string { return d.ln.Addr().String() }

func (d *replyDropper) accept() {
	defer d.wg.Done()
	for {
		c, err := d.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", d.target)
		if err != nil {
			c.Close()
			continue
		}
		d.mu.Lock()
		d.conns = append(d.conns, c, s)
		d.mu.Unlock()
		d.wg.Add(2)
		go d.forward(c, s)
	}
}

// forward copies client c to server s; a script to drop arms the copy back,
// which then drops the next bytes from Redis (the script's reply: go-redis
// waits for each reply before it sends more on a connection) and closes both.
func (d *replyDropper) forward(c, s net.Conn) {
	defer d.wg.Done()
	armed := make(chan struct{}, 1)
	go func() {
		defer d.wg.Done()
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				select {
				case <-armed:
					s.Close()
					return
				default:
				}
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			cmd := bytes.ToLower(buf[:n])
			if isScript(cmd) && !isProbe(cmd) {
				d.scripts.Add(1)
				if d.drops.Add(-1) >= 0 {
					armed <- struct{}{}
				}
			}
			if _, err := s.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// isScript reports whether cmd, a command in lower case, runs a script.
func isScript(cmd []byte) bool {
	return bytes.Contains(cmd, []byte("\r\nevalsha\r\n")) || bytes.Contains(cmd, []byte("\r\neval\r\n")) || bytes.Contains(cmd, []byte("\r\nfcall\r\n"))
}

// isProbe reports whether cmd, a command in lower case, is a rescue probe:
// its one key ends with probeSuffix.
func isProbe(cmd []byte) bool {
	return bytes.Contains(cmd, []byte("}"+probeSuffix+"\r\n"))
}

func (d *replyDropper) close() {
	d.ln.Close()
	d.mu.Lock()
	for _, c := range d.conns {
		c.Close()
	}
	d.mu.Unlock()
	d.wg.Wait()
}
