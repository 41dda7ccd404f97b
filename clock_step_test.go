package redlimit

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// timeAnswer answers TIME with answer's time or error, without a server;
// other commands go on (and fail: nothing listens).
type timeAnswer struct {
	passHooks
	answer func(ctx context.Context) (time.Time, error)
}

func (h timeAnswer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		tc, ok := cmd.(*redis.TimeCmd)
		if !ok {
			return next(ctx, cmd)
		}
		v, err := h.answer(ctx)
		if err != nil {
			tc.SetErr(err)
			return err
		}
		tc.SetVal(v)
		return nil
	}
}

// timeClient returns a client whose TIME answer gives.
func timeClient(t *testing.T, answer func(ctx context.Context) (time.Time, error)) redis.UniversalClient {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	rdb.AddHook(timeAnswer{answer: answer})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// simAt returns a simulated clock (no monotonic readings) set to at.
func simAt(at time.Time) *simClock {
	c := &simClock{}
	c.us.Store(at.UnixMicro())
	return c
}

func (c *simClock) add(d time.Duration) { c.us.Add(d.Microseconds()) }

// A clock set back by less than the time since the last measurement is
// measured again: the time sent goes on with the server's. (It stood
// still, then ran behind until the next resync.)
func TestClientClockStepBack(t *testing.T) {
	client, server := simAt(t0), simAt(t0)
	c := newClientClock(timeClient(t, func(context.Context) (time.Time, error) { return server.now(), nil }), client.now)
	ctx := t.Context()
	for _, s := range []struct {
		name           string
		client, server time.Duration // moves of either clock before the call
		want           time.Duration // from t0
	}{
		{"first", 0, 0, 0},
		{"both move 5s", 5 * time.Second, 5 * time.Second, 5 * time.Second},
		{"client set back 2s", -2 * time.Second, 0, 5 * time.Second},
		{"both move 1s", time.Second, time.Second, 6 * time.Second},
	} {
		client.add(s.client)
		server.add(s.server)
		got, err := c.nowMicros(ctx)
		require.NoError(t, err, s.name)
		if got, want := time.Duration(got-t0.UnixMicro())*time.Microsecond, s.want; got != want {
			t.Errorf("%s: got t0+%v, want t0+%v", s.name, got, want)
		}
	}
}

// A clock set forward while another call measures is not sent with the
// old measurement: the call waits for the new one. (It sent the client's
// time plus the old offset, an hour ahead.)
func TestClientClockStepDuringMeasurement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client, server := simAt(t0), simAt(t0)
		var hold atomic.Bool
		gate := make(chan struct{})
		rdb := timeClient(t, func(context.Context) (time.Time, error) {
			if hold.Load() {
				<-gate
			}
			return server.now(), nil
		})
		c := newClientClock(rdb, client.now)
		first, err := c.nowMicros(t.Context())
		require.NoError(t, err)
		require.Equal(t, t0.UnixMicro(), first)

		client.add(clockResyncInterval + time.Second) // a resync is due
		server.add(clockResyncInterval + time.Second)
		hold.Store(true)
		var got [2]int64
		var errs [2]error
		var wg sync.WaitGroup
		wg.Go(func() { got[0], errs[0] = c.nowMicros(t.Context()) })
		synctest.Wait() // the first call measures, its TIME held
		client.add(time.Hour)
		wg.Go(func() { got[1], errs[1] = c.nowMicros(t.Context()) })
		synctest.Wait()
		close(gate)
		wg.Wait()
		want := t0.Add(clockResyncInterval + time.Second).UnixMicro()
		for i := range got {
			require.NoError(t, errs[i])
			if got[i] != want {
				t.Errorf("call %d: got t0+%v, want t0+%v (the server's time)", i,
					time.Duration(got[i]-t0.UnixMicro())*time.Microsecond, time.Duration(want-t0.UnixMicro())*time.Microsecond)
			}
		}
	})
}

// The offset is measured on a warm connection: the time to dial (and the
// handshake) does not count. Dialing takes 40 ms here, on both clocks;
// they agree. (The offset was measured as 20 ms.)
func TestClientClockMeasuresWarm(t *testing.T) {
	m := miniredis.RunT(t)
	clock := simAt(t0)
	m.SetTime(t0)
	rdb := redis.NewClient(&redis.Options{
		Addr: m.Addr(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			clock.add(40 * time.Millisecond)
			m.SetTime(clock.now())
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { rdb.Close() })
	c := newClientClock(rdb, clock.now)
	got, err := c.nowMicros(t.Context())
	require.NoError(t, err)
	if got, want := time.Duration(got-clock.now().UnixMicro())*time.Microsecond, time.Duration(0); got != want {
		t.Errorf("sent the client's time %+v, want %+v: the clocks agree", got, want)
	}
}

// Calls waiting for the first measurement share one, and each waits only
// as long as its context lets it. (Each waiter sent TIME in turn once the
// one before had failed: with TIME hanging 200 ms, ten calls took 200 ms
// to 2 s, and one with a 50 ms deadline took a second.)
func TestClientClockWaitShared(t *testing.T) {
	errTime := errors.New("TIME failed")
	var times atomic.Int32
	gate := make(chan struct{}) // TIME hangs until it is closed, then fails
	release := sync.OnceFunc(func() { close(gate) })
	// (TIME does not end with the measurement's timeout, which a loaded
	// machine could reach before release.)
	rdb := timeClient(t, func(context.Context) (time.Time, error) {
		times.Add(1)
		<-gate
		return time.Time{}, errTime
	})
	c := newClientClock(rdb, simAt(t0).now)
	t.Cleanup(c.close)
	t.Cleanup(release) // first: the measurement ends, then close

	waiting := make(chan struct{}, 10)
	awaited := 0 // calls seen waiting
	await := func(n int) {
		t.Helper()
		for ; awaited < n; awaited++ {
			select {
			case <-waiting:
			case <-time.After(5 * time.Second):
				t.Errorf("%d of %d calls wait for the measurement, 5s on", awaited, n)
				return
			}
		}
	}
	var wg sync.WaitGroup
	var errs [10]error
	for i := range errs {
		wg.Go(func() { _, errs[i] = c.nowMicros(&waitingCtx{Context: context.Background(), waiting: waiting}) })
	}
	await(1) // the measurement is under way

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	deadlined := make(chan error, 1)
	go func() {
		_, err := c.nowMicros(ctx)
		deadlined <- err
	}()
	select {
	case err := <-deadlined:
		assert.EqualError(t, err, "redlimit: client clock: context deadline exceeded")
		assert.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Error("a call with a 50ms deadline still waits 5s later, while TIME hangs")
	}
	await(len(errs))
	release()
	wg.Wait()
	for i, err := range errs {
		assert.ErrorIs(t, err, errTime, "call %d", i)
	}
	assert.Equal(t, int32(1), times.Load(), "TIME sent")
}

// waitingCtx tells, on waiting, when a call first waits on its Done (or
// passes it to TIME).
type waitingCtx struct {
	context.Context
	waiting chan<- struct{}
	once    sync.Once
}

func (c *waitingCtx) Done() <-chan struct{} {
	c.once.Do(func() { c.waiting <- struct{}{} })
	return c.Context.Done()
}

// Close ends a measurement under way, whose call has gone (its deadline
// passed) while TIME hangs: no goroutine outlives the limiter. (The
// measurement ran on for its own timeout, or longer without
// ContextTimeoutEnabled.)
func TestClientClockCloseEndsMeasurement(t *testing.T) {
	before := goleak.IgnoreCurrent()
	rdb := timeClient(t, func(ctx context.Context) (time.Time, error) {
		<-ctx.Done()
		return time.Time{}, ctx.Err()
	})
	lim, err := NewTokenBucket(rdb, PerSecond(10), WithClientClock())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, err = lim.Allow(ctx, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, lim.Close())
	// (The client, closed at the test's end, keeps its own.)
	require.NoError(t, goleak.Find(before,
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/maintnotifications.(*CircuitBreakerManager).cleanupLoop")),
		"a goroutine outlived Close")
	_, err = lim.clock.nowMicros(t.Context())
	require.ErrorIs(t, err, ErrClosed, "a measurement after Close")
}
