package grpclimit_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func miniConcurrency(t *testing.T, maxHolders int, ttl time.Duration) (*redlimit.Concurrency, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 80})
	t.Cleanup(func() { rdb.Close() })
	c, err := redlimit.NewConcurrency(rdb, maxHolders, ttl, redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, rdb
}

func leases(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	n, err := rdb.ZCard(context.Background(), "redlimit:{"+key+"}:cc").Result()
	require.NoError(t, err)
	return n
}

func concurrencyServer(t *testing.T, c *redlimit.Concurrency, h *funcHealth, opts ...grpclimit.Option) healthpb.HealthClient {
	opts = append(opts, grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-tenant")))
	return serveFunc(t, grpclimit.ConcurrencyUnaryServerInterceptor(c, opts...), grpclimit.ConcurrencyStreamServerInterceptor(c, opts...), h)
}

// 64 unary calls at once on a cap of 3: at most 3 handlers run at once,
// the others fail with ResourceExhausted, and every lease is released.
func TestConcurrencyInterceptorHoldsAtMostMax(t *testing.T) {
	t.Parallel()
	c, rdb := miniConcurrency(t, 3, 10*time.Second)
	var inFlight, most, served, denied atomic.Int64
	h := &funcHealth{check: func(ctx context.Context) error {
		n := inFlight.Add(1)
		for m := most.Load(); n > m; m = most.Load() {
			if most.CompareAndSwap(m, n) {
				break
			}
		}
		_, ok := grpclimit.LeaseFromContext(ctx)
		assert.True(t, ok, "the lease is in the handler's context")
		time.Sleep(20 * time.Millisecond)
		inFlight.Add(-1)
		return nil
	}}
	client := concurrencyServer(t, c, h)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			_, err := client.Check(tenantCtx(t, "t", 1), &healthpb.HealthCheckRequest{})
			switch status.Code(err) {
			case codes.OK:
				served.Add(1)
			case codes.ResourceExhausted:
				denied.Add(1)
			default:
				t.Errorf("call: %v", err)
			}
		})
	}
	wg.Wait()
	t.Logf("64 calls: %d served, %d denied, most at once %d", served.Load(), denied.Load(), most.Load())
	assert.LessOrEqual(t, most.Load(), int64(3), "handlers running at once")
	assert.GreaterOrEqual(t, served.Load(), int64(3))
	assert.Equal(t, int64(64), served.Load()+denied.Load())
	require.Eventually(t, func() bool { return leases(t, rdb, "t") == 0 }, 2*time.Second, 5*time.Millisecond, "leases left in Redis")
}

// The RetryInfo delay is the hint: the average hold (300ms here), not the
// oldest lease's expiry (about 10s); before any call ended, the default.
// A stream holds its lease until its handler returns.
func TestConcurrencyInterceptorRetryHint(t *testing.T) {
	t.Parallel()
	c, rdb := miniConcurrency(t, 1, 10*time.Second)
	release := make(chan struct{}, 1)
	var hold atomic.Int64
	h := &funcHealth{
		check: func(context.Context) error {
			if d := time.Duration(hold.Load()); d > 0 {
				time.Sleep(d)
				return nil
			}
			<-release
			return nil
		},
		watch: func(context.Context) error { <-release; return nil },
	}
	client := concurrencyServer(t, c, h, grpclimit.WithRetryAfterHint(2*time.Second))
	denial := func(what string) (time.Duration, metadata.MD) {
		t.Helper()
		var header metadata.MD
		_, err := client.Check(tenantCtx(t, "t", 1), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		st := status.Convert(err)
		require.Equal(t, codes.ResourceExhausted, st.Code(), what)
		require.Len(t, st.Details(), 1, what)
		return st.Details()[0].(*errdetails.RetryInfo).GetRetryDelay().AsDuration(), header
	}
	// A stream holds the one slot: the default hint.
	stream, err := client.Watch(tenantCtx(t, "t", 1), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return leases(t, rdb, "t") == 1 }, 2*time.Second, 5*time.Millisecond)
	delay, header := denial("while a stream holds the slot")
	assert.Equal(t, 2*time.Second, delay, "before any call ended: WithRetryAfterHint's")
	assert.Equal(t, []string{"2"}, header.Get(grpclimit.HeaderRetryAfter))
	release <- struct{}{}
	_, err = stream.Recv()
	require.NoError(t, err)
	require.Eventually(t, func() bool { return leases(t, rdb, "t") == 0 }, 2*time.Second, 5*time.Millisecond, "the stream's lease released")

	// Holds of 300ms: the hint moves to them (the stream's hold, some
	// ms, was the first observed; each 300ms hold moves it by an eighth,
	// so after 8 it is within 300ms × (7/8)^8 = 103ms of 300ms).
	hold.Store(int64(300 * time.Millisecond))
	for range 8 {
		_, err := client.Check(tenantCtx(t, "t", 1), &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
	}
	hold.Store(0)
	done := make(chan error, 1)
	go func() {
		_, err := client.Check(tenantCtx(t, "t", 1), &healthpb.HealthCheckRequest{})
		done <- err
	}()
	require.Eventually(t, func() bool { return leases(t, rdb, "t") == 1 }, 2*time.Second, 5*time.Millisecond)
	delay, header = denial("after holds of 300ms")
	t.Logf("RetryInfo delay after 8 holds of 300ms (10s ttl): %v", delay)
	assert.Greater(t, delay, 190*time.Millisecond)
	assert.Less(t, delay, time.Second, "the hint, not the lease's expiry")
	assert.Equal(t, []string{"1"}, header.Get(grpclimit.HeaderRetryAfter))
	release <- struct{}{}
	require.NoError(t, <-done)
}

// A handler that panics releases its lease, and the panic goes on.
func TestConcurrencyInterceptorReleasesOnPanic(t *testing.T) {
	t.Parallel()
	c, rdb := miniConcurrency(t, 1, time.Minute)
	unary := grpclimit.ConcurrencyUnaryServerInterceptor(c, grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-tenant")))
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tenant", "p"))
	info := &grpc.UnaryServerInfo{FullMethod: healthpb.Health_Check_FullMethodName}
	var held int64
	require.PanicsWithValue(t, "handler bug", func() {
		_, _ = unary(in, nil, info, func(context.Context, any) (any, error) {
			held = leases(t, rdb, "p")
			panic("handler bug")
		})
	})
	assert.Equal(t, int64(1), held, "lease held while the handler ran")
	assert.Equal(t, int64(0), leases(t, rdb, "p"), "lease released after the panic")
}

// A cancelled call releases its lease when its handler returns.
func TestConcurrencyInterceptorReleasesOnCancel(t *testing.T) {
	t.Parallel()
	c, rdb := miniConcurrency(t, 1, time.Minute)
	started := make(chan struct{})
	h := &funcHealth{check: func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}}
	client := concurrencyServer(t, c, h)
	ctx, cancel := context.WithCancel(tenantCtx(t, "c", 1))
	go func() { <-started; cancel() }()
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Canceled, status.Code(err))
	require.Eventually(t, func() bool { return leases(t, rdb, "c") == 0 }, 5*time.Second, 5*time.Millisecond,
		"lease released after the call was cancelled")
}

// serverStream is a grpc.ServerStream with a context and no transport,
// for calling a stream interceptor directly.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s serverStream) Context() context.Context     { return s.ctx }
func (s serverStream) SetHeader(metadata.MD) error  { return nil }
func (s serverStream) SendHeader(metadata.MD) error { return nil }

// The rate and the concurrency interceptors, unary and stream, answer a
// skipped call, a call without a key and a limiter's failure alike: the
// key comes from the one lookup they share, and so does the status of a
// limiter error (only its message names the limiter).
func TestInterceptorsKeyAndLimiterErrors(t *testing.T) {
	t.Parallel()
	errStore := errors.New("tenant store down")
	tenantKey := grpclimit.MetadataKey("x-tenant")
	tests := []struct {
		name     string
		key      grpclimit.KeyFunc
		tenant   []string // the x-tenant metadata
		skip     bool
		down     bool // Redis closed
		canceled bool // the call's context
		code     codes.Code
		msg      string // the status message; "limiter" is "rate limiter" or "concurrency limiter"
		reported error  // wrapped by the error given to WithOnError; nil: none reported
	}{
		{"allowed", tenantKey, []string{"t"}, false, false, false, codes.OK, "", nil},
		{"skipped, Redis down", tenantKey, nil, true, true, false, codes.OK, "", nil},
		{"missing metadata", tenantKey, nil, false, false, false, codes.InvalidArgument, `grpclimit: no "x-tenant" metadata: no rate-limit key`, grpclimit.ErrNoKey},
		{"empty key", func(context.Context, string) (string, error) { return "", nil }, nil, false, false, false, codes.InvalidArgument,
			"grpclimit: /grpc.health.v1.Health/Check: empty key: no rate-limit key", grpclimit.ErrNoKey},
		{"KeyFunc error", func(context.Context, string) (string, error) { return "", errStore }, nil, false, false, false, codes.Internal,
			"grpclimit: cannot find the rate-limit key", errStore},
		{"KeyFunc status", func(context.Context, string) (string, error) {
			return "", status.Error(codes.Unauthenticated, "unknown API key")
		},
			nil, false, false, false, codes.Unauthenticated, "unknown API key", nil},
		{"Redis down", tenantKey, []string{"t"}, false, true, false, codes.Unavailable, "grpclimit: limiter unavailable", redlimit.ErrUnavailable},
		{"canceled", tenantKey, []string{"t"}, false, false, true, codes.Canceled, "context canceled", context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := miniredis.RunT(t)
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
			t.Cleanup(func() { rdb.Close() })
			c, err := redlimit.NewConcurrency(rdb, 3, time.Minute, redlimit.WithFallback(redlimit.FallbackError))
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerMinute(10), redlimit.WithFallback(redlimit.FallbackError))
			require.NoError(t, err)
			t.Cleanup(func() { lim.Close() })
			if tt.down {
				m.Close()
			}
			var reported []error
			opts := []grpclimit.Option{
				grpclimit.WithKeyFunc(tt.key),
				grpclimit.WithOnError(func(_ context.Context, _ string, err error) { reported = append(reported, err) }),
			}
			if tt.skip {
				opts = append(opts, grpclimit.WithSkip(func(context.Context, string) bool { return true }))
			}
			ctx := t.Context()
			if tt.tenant != nil {
				ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("x-tenant", tt.tenant[0]))
			}
			if tt.canceled {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				cancel()
			}
			const method = healthpb.Health_Check_FullMethodName
			for _, in := range []struct {
				name    string
				limiter string
				unary   grpc.UnaryServerInterceptor
				stream  grpc.StreamServerInterceptor
			}{
				{"rate", "rate limiter", grpclimit.UnaryServerInterceptor(lim, opts...), grpclimit.StreamServerInterceptor(lim, opts...)},
				{"concurrency", "concurrency limiter", grpclimit.ConcurrencyUnaryServerInterceptor(c, opts...), grpclimit.ConcurrencyStreamServerInterceptor(c, opts...)},
			} {
				for _, kind := range []string{"unary", "stream"} {
					what := in.name + " " + kind
					reported = nil
					handled := 0
					if kind == "unary" {
						_, err = in.unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) {
							handled++
							return nil, nil
						})
					} else {
						err = in.stream(struct{}{}, serverStream{ctx: ctx}, &grpc.StreamServerInfo{FullMethod: method}, func(any, grpc.ServerStream) error {
							handled++
							return nil
						})
					}
					st := status.Convert(err)
					assert.Equal(t, tt.code, st.Code(), "%s: status %v", what, err)
					assert.Equal(t, strings.Replace(tt.msg, "limiter", in.limiter, 1), st.Message(), "%s: status message", what)
					if tt.code == codes.OK {
						assert.Equal(t, 1, handled, "%s: handler calls", what)
					} else {
						assert.Zero(t, handled, "%s: handler calls", what)
					}
					if tt.reported == nil && tt.code != codes.Unauthenticated {
						assert.Empty(t, reported, "%s: errors reported", what)
					} else {
						require.Len(t, reported, 1, "%s: errors reported", what)
						if tt.reported != nil {
							assert.ErrorIs(t, reported[0], tt.reported, "%s: error reported", what)
						}
					}
				}
			}
		})
	}
}
