package clientclock

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
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

var errClosed = errors.New("redlimit: limiter closed")

// timeFunc is a Server whose TIME answers the function's time or error.
type timeFunc func(ctx context.Context) (time.Time, error)

func (f timeFunc) Time(ctx context.Context) *redis.TimeCmd {
	cmd := redis.NewTimeCmd(ctx)
	v, err := f(ctx)
	if err != nil {
		cmd.SetErr(err)
	} else {
		cmd.SetVal(v)
	}
	return cmd
}

// simClock is a simulated clock (no monotonic readings), in whole µs.
type simClock struct{ us atomic.Int64 }

// simAt returns a simulated clock set to at.
func simAt(at time.Time) *simClock {
	c := &simClock{}
	c.us.Store(at.UnixMicro())
	return c
}

func (c *simClock) now() time.Time      { return time.UnixMicro(c.us.Load()) }
func (c *simClock) add(d time.Duration) { c.us.Add(d.Microseconds()) }

// newClock returns a Clock on srv, closed at the test's end.
func newClock(t *testing.T, srv Server, now func() time.Time) *Clock {
	c := New(srv, now, errClosed)
	t.Cleanup(c.Close)
	return c
}

// miniClient returns a client of a miniredis whose clock is t0.
func miniClient(t *testing.T) (*miniredis.Miniredis, *redis.Client) {
	m := miniredis.RunT(t)
	m.SetTime(t0)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return m, rdb
}

// offset returns the server's clock minus the client's, in µs, as last
// measured.
func offset(c *Clock) int64 {
	b := c.base.Load()
	return b.server - b.at.UnixMicro()
}

// The time sent never goes backwards, even when the client's clock does.
func TestMonotonic(t *testing.T) {
	_, rdb := miniClient(t)
	local := t0
	c := newClock(t, rdb, func() time.Time { return local })
	ctx := t.Context()
	first, err := c.NowMicros(ctx)
	require.NoError(t, err)
	assert.Equal(t, t0.UnixMicro(), first, "miniredis's TIME is t0, as the local clock: no offset")
	local = local.Add(-time.Second) // the local clock steps back: measured again
	second, err := c.NowMicros(ctx)
	require.NoError(t, err)
	assert.Equal(t, first, second, "never backwards")
	assert.Equal(t, time.Second.Microseconds(), offset(c), "the step is measured")
	local = local.Add(time.Second) // a second passes
	third, err := c.NowMicros(ctx)
	require.NoError(t, err)
	assert.Equal(t, t0.Add(time.Second).UnixMicro(), third)
}

// The offset is measured again after clockResyncInterval and after Stale
// (an outage).
func TestResync(t *testing.T) {
	m, rdb := miniClient(t)
	local := t0
	c := newClock(t, rdb, func() time.Time { return local })
	ctx := t.Context()
	_, err := c.NowMicros(ctx)
	require.NoError(t, err)
	require.Zero(t, offset(c))
	m.SetTime(t0.Add(5 * time.Second)) // the server's clock moves on its own
	local = local.Add(time.Second)
	got, err := c.NowMicros(ctx)
	require.NoError(t, err)
	assert.Equal(t, t0.Add(time.Second).UnixMicro(), got, "within the resync interval: the old offset")
	local = local.Add(clockResyncInterval)
	got, err = c.NowMicros(ctx)
	require.NoError(t, err)
	assert.Equal(t, t0.Add(5*time.Second).UnixMicro(), got, "after the interval: the server's time")
	c.Stale()
	m.SetTime(t0.Add(time.Hour))
	got, err = c.NowMicros(ctx)
	require.NoError(t, err)
	assert.Equal(t, t0.Add(time.Hour).UnixMicro(), got, "after an outage: measured again")
}

// A clock set back by less than the time since the last measurement is
// measured again: the time sent goes on with the server's. (It stood
// still, then ran behind until the next resync.)
func TestStepBack(t *testing.T) {
	client, server := simAt(t0), simAt(t0)
	c := newClock(t, timeFunc(func(context.Context) (time.Time, error) { return server.now(), nil }), client.now)
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
		got, err := c.NowMicros(ctx)
		require.NoError(t, err, s.name)
		if got, want := time.Duration(got-t0.UnixMicro())*time.Microsecond, s.want; got != want {
			t.Errorf("%s: got t0+%v, want t0+%v", s.name, got, want)
		}
	}
}

// A clock set forward while another call measures is not sent with the
// old measurement: the call waits for the new one. (It sent the client's
// time plus the old offset, an hour ahead.)
func TestStepDuringMeasurement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client, server := simAt(t0), simAt(t0)
		var hold atomic.Bool
		gate := make(chan struct{})
		c := newClock(t, timeFunc(func(context.Context) (time.Time, error) {
			if hold.Load() {
				<-gate
			}
			return server.now(), nil
		}), client.now)
		first, err := c.NowMicros(t.Context())
		require.NoError(t, err)
		require.Equal(t, t0.UnixMicro(), first)

		client.add(clockResyncInterval + time.Second) // a resync is due
		server.add(clockResyncInterval + time.Second)
		hold.Store(true)
		var got [2]int64
		var errs [2]error
		var wg sync.WaitGroup
		wg.Go(func() { got[0], errs[0] = c.NowMicros(t.Context()) })
		synctest.Wait() // the first call measures, its TIME held
		client.add(time.Hour)
		wg.Go(func() { got[1], errs[1] = c.NowMicros(t.Context()) })
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
func TestMeasuresWarm(t *testing.T) {
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
	c := newClock(t, rdb, clock.now)
	got, err := c.NowMicros(t.Context())
	require.NoError(t, err)
	if got, want := time.Duration(got-clock.now().UnixMicro())*time.Microsecond, time.Duration(0); got != want {
		t.Errorf("sent the client's time %+v, want %+v: the clocks agree", got, want)
	}
}

// Calls waiting for the first measurement share one, and each waits only
// as long as its context lets it. (Each waiter sent TIME in turn once the
// one before had failed: with TIME hanging 200 ms, ten calls took 200 ms
// to 2 s, and one with a 50 ms deadline took a second.)
func TestWaitShared(t *testing.T) {
	errTime := errors.New("TIME failed")
	var times atomic.Int32
	gate := make(chan struct{}) // TIME hangs until it is closed, then fails
	release := sync.OnceFunc(func() { close(gate) })
	// (TIME does not end with the measurement's timeout, which a loaded
	// machine could reach before release.)
	c := newClock(t, timeFunc(func(context.Context) (time.Time, error) {
		times.Add(1)
		<-gate
		return time.Time{}, errTime
	}), simAt(t0).now)
	t.Cleanup(release) // first: the measurement ends, then Close

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
		wg.Go(func() { _, errs[i] = c.NowMicros(&waitingCtx{Context: context.Background(), waiting: waiting}) })
	}
	await(1) // the measurement is under way

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	deadlined := make(chan error, 1)
	go func() {
		_, err := c.NowMicros(ctx)
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

// Close ends the measurement under way and waits for it; a call that
// needs one after Close gets the closed error, named once in its message.
func TestClose(t *testing.T) {
	c := New(timeFunc(func(ctx context.Context) (time.Time, error) {
		<-ctx.Done() // TIME hangs until the measurement ends
		return time.Time{}, ctx.Err()
	}), simAt(t0).now, errClosed)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, err := c.NowMicros(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	c.Close() // returns only once the measurement has ended
	c.Wait()
	_, err = c.NowMicros(t.Context())
	require.ErrorIs(t, err, errClosed, "a measurement after Close")
	assert.EqualError(t, err, "redlimit: client clock: limiter closed")
}

// Wait returns once the measurement under way has ended: the next call
// finds its base.
func TestWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		c := newClock(t, timeFunc(func(context.Context) (time.Time, error) {
			<-gate
			return t0, nil
		}), simAt(t0).now)
		c.Behind() // a measurement in the background, which no call waits for
		synctest.Wait()
		require.Nil(t, c.base.Load(), "measured before TIME answered")
		waited := make(chan struct{})
		go func() {
			c.Wait()
			close(waited)
		}()
		synctest.Wait()
		select {
		case <-waited:
			t.Fatal("Wait returned while TIME hangs")
		default:
		}
		close(gate)
		<-waited
		assert.NotNil(t, c.base.Load(), "the measurement Wait waited for")
	})
}
