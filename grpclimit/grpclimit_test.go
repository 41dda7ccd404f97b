package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
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
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/emptypb"
)

// windowStart is a time 250ms into a one-second window, so a fixed window
// of one second denies with RetryAfter 750ms.
var windowStart = time.Unix(1_700_000_000, 250*int64(time.Millisecond))

// fixedWindow returns a FixedWindow limiter of PerSecond(2) on a fresh
// miniredis whose clock stands still at windowStart.
func fixedWindow(t *testing.T) *redlimit.RateLimiter {
	t.Helper()
	_, lim := fixedWindowOf(t, redlimit.PerSecond(2))
	return lim
}

// fixedWindowOf returns a FixedWindow limiter of limit on a fresh
// miniredis whose clock stands still at windowStart, and the miniredis.
func fixedWindowOf(t *testing.T, limit redlimit.Limit) (*miniredis.Miniredis, *redlimit.RateLimiter) {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(windowStart)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewFixedWindow(rdb, limit, redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	return m, lim
}

// server holds a health service behind the interceptors, on bufconn.
type server struct {
	conn   *grpc.ClientConn
	client healthpb.HealthClient
	calls  atomic.Int64 // calls that reached past the interceptors

	mu    sync.Mutex
	unary []string // the methods of the unary calls that reached past the interceptors
}

func newServer(t *testing.T, lim redlimit.Limiter, opts ...grpclimit.Option) *server {
	t.Helper()
	return newServerWith(t, lim, nil, opts...)
}

// newServerWith is newServer with more server options, such as
// grpc.UnknownServiceHandler.
func newServerWith(t *testing.T, lim redlimit.Limiter, srvOpts []grpc.ServerOption, opts ...grpclimit.Option) *server {
	t.Helper()
	s := &server{}
	count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		s.calls.Add(1)
		s.mu.Lock()
		s.unary = append(s.unary, info.FullMethod)
		s.mu.Unlock()
		return h(ctx, req)
	}
	countStream := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		s.calls.Add(1)
		return h(srv, ss)
	}
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(append([]grpc.ServerOption{
		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, opts...), count),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(lim, opts...), countStream),
	}, srvOpts...)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) }) // nil once stopped
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	s.conn = conn
	s.client = healthpb.NewHealthClient(conn)
	return s
}

// check makes one unary call and returns its error and response headers.
func (s *server) check(t *testing.T, md ...string) (metadata.MD, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	var header metadata.MD
	_, err := s.client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	return header, err
}

// watch opens one stream and returns the error of its first message.
func (s *server) watch(t *testing.T, md ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	stream, err := s.client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

// stream opens a bidirectional stream to any method, closes its sending
// side and returns the status it ends with.
func (s *server) stream(t *testing.T, method string, md ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	stream, err := s.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method)
	if err != nil {
		return err
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	for {
		if err := stream.RecvMsg(new(emptypb.Empty)); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// invoke makes one unary call to any method and returns its error.
func (s *server) invoke(t *testing.T, method string, md ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, md...)
	return s.conn.Invoke(ctx, method, &emptypb.Empty{}, new(emptypb.Empty))
}

// unaryMethods returns the methods of the unary calls that reached past
// the interceptors.
func (s *server) unaryMethods() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.unary)
}

// unknownHandler returns a grpc.UnknownServiceHandler that counts the
// streams it gets in n and ends them at once, as the reproducer's proxy
// does.
func unknownHandler(n *atomic.Int64) grpc.ServerOption {
	return grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		n.Add(1)
		return nil
	})
}

// wantCode fails the test unless err has the status code want.
func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	got := status.Code(err)
	require.Equal(t, want, got, "%s: got code %v (%v), want %v", what, got, err, want)
}

// wantDenied fails the test unless err is ResourceExhausted with a
// RetryInfo detail of delay want.
func wantDenied(t *testing.T, what string, err error, want time.Duration) {
	t.Helper()
	wantCode(t, what, err, codes.ResourceExhausted)
	var infos []*errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			infos = append(infos, ri)
		}
	}
	require.Len(t, infos, 1, "%s: got %d RetryInfo details in %v, want 1", what, len(infos), err)
	got := infos[0].GetRetryDelay().AsDuration()
	require.True(t, got > 0 && got <= time.Second, "%s: got retry delay %v, want in (0, 1s]", what, got)
	require.Equal(t, want, got, "%s: got retry delay %v, want %v", what, got, want)
}

func TestUnary(t *testing.T) {
	t.Parallel()
	s := newServer(t, fixedWindow(t))
	for i, want := range []string{"1", "0"} {
		header, err := s.check(t)
		require.NoError(t, err, "call %d", i+1)
		got := header.Get(grpclimit.HeaderRemaining)
		assert.Equal(t, []string{want}, got, "call %d: got %s %q, want %q", i+1, grpclimit.HeaderRemaining, got, want)
	}
	header, err := s.check(t)
	wantDenied(t, "call 3", err, 750*time.Millisecond)
	for name, want := range map[string]string{
		grpclimit.HeaderLimit:      "2",
		grpclimit.HeaderRemaining:  "0",
		grpclimit.HeaderReset:      "1",
		grpclimit.HeaderRetryAfter: "1",
	} {
		got := header.Get(name)
		assert.Equal(t, []string{want}, got, "call 3: got %s %q, want %q", name, got, want)
	}
	got, want := s.calls.Load(), int64(2)
	assert.Equal(t, want, got, "got %d calls to the handler, want %d", got, want)
}

func TestStream(t *testing.T) {
	t.Parallel()
	s := newServer(t, fixedWindow(t))
	for i := range 2 {
		require.NoError(t, s.watch(t), "stream %d", i+1)
	}
	wantDenied(t, "stream 3", s.watch(t), 750*time.Millisecond)
	got, want := s.calls.Load(), int64(2)
	assert.Equal(t, want, got, "got %d streams to the handler, want %d", got, want)
}

func TestUnaryAndStreamShareLimit(t *testing.T) {
	t.Parallel()
	s := newServer(t, fixedWindow(t))
	_, err := s.check(t)
	require.NoError(t, err)
	require.NoError(t, s.watch(t))
	_, err = s.check(t)
	wantDenied(t, "call 3", err, 750*time.Millisecond)
}

func TestPerMethod(t *testing.T) {
	t.Parallel()
	s := newServer(t, fixedWindow(t), grpclimit.WithPerMethod())
	for i := range 2 {
		_, err := s.check(t)
		require.NoError(t, err, "Check %d", i+1)
		require.NoError(t, s.watch(t), "Watch %d", i+1)
	}
	_, err := s.check(t)
	wantDenied(t, "Check 3", err, 750*time.Millisecond)
	wantDenied(t, "Watch 3", s.watch(t), 750*time.Millisecond)
}

// TestPerMethodUnknownMethods is a gRPC proxy: its
// grpc.UnknownServiceHandler gets every call to a method the server did
// not register, under whatever name the client sends. With WithPerMethod,
// a client making up method names is still limited, and makes no Redis key
// per name; the registered methods keep a limit each.
func TestPerMethodUnknownMethods(t *testing.T) {
	t.Parallel()
	m, lim := fixedWindowOf(t, redlimit.PerSecond(1))
	var unknown atomic.Int64
	s := newServerWith(t, lim, []grpc.ServerOption{unknownHandler(&unknown)}, grpclimit.WithPerMethod())
	for i := range 50 {
		method := fmt.Sprintf("/x.Y/Z%d", i)
		err := s.stream(t, method)
		if i == 0 {
			require.NoError(t, err, method)
		} else {
			wantDenied(t, method, err, 750*time.Millisecond)
		}
	}
	// A registered service with a method it does not have is no way out,
	// nor is a unary call: grpc-go hands it to the unknown handler as a
	// stream.
	wantDenied(t, "unknown Health method", s.stream(t, "/grpc.health.v1.Health/Z"), 750*time.Millisecond)
	wantDenied(t, "unary call to an unknown method", s.invoke(t, "/x.Y/Unary"), 750*time.Millisecond)
	got := unknown.Load()
	assert.Equal(t, int64(1), got, "got %d streams to the unknown handler, want 1", got)
	keys := m.Keys()
	assert.Len(t, keys, 1, "Redis keys after 52 calls to unknown methods: %q", keys)

	_, err := s.check(t)
	require.NoError(t, err, "Check 1")
	require.NoError(t, s.watch(t), "Watch 1")
	_, err = s.check(t)
	wantDenied(t, "Check 2", err, 750*time.Millisecond)
	wantDenied(t, "Watch 2", s.watch(t), 750*time.Millisecond)
	keys = m.Keys()
	assert.Len(t, keys, 3, "Redis keys after the registered methods too: %q", keys)
}

// TestPerMethodKeysOfUnknownMethods checks the keys given to the limiter
// for registered and unknown methods, and that unary calls to unknown
// methods never reach a unary interceptor.
func TestPerMethodKeysOfUnknownMethods(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		opts []grpclimit.Option
		want []string
	}{
		{"WithPerMethod", []grpclimit.Option{grpclimit.WithPerMethod()}, []string{
			"/grpc.health.v1.Health/Check k1",
			"/grpc.health.v1.Health/Watch k1",
			"unknown k1",
			"unknown k1",
			"unknown k1",
			"unknown k1",
		}},
		{"default", nil, []string{"k1", "k1", "k1", "k1", "k1", "k1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := &fake{res: redlimit.Result{Allowed: true, Limit: redlimit.PerSecond(1)}}
			var unknown atomic.Int64
			opts := append([]grpclimit.Option{grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-api-key"))}, tt.opts...)
			s := newServerWith(t, f, []grpc.ServerOption{unknownHandler(&unknown)}, opts...)
			_, err := s.check(t, "x-api-key", "k1")
			require.NoError(t, err, "Check")
			require.NoError(t, s.watch(t, "x-api-key", "k1"), "Watch")
			require.NoError(t, s.stream(t, "/x.Y/Z", "x-api-key", "k1"), "/x.Y/Z")
			require.NoError(t, s.stream(t, "/grpc.health.v1.Health/Z", "x-api-key", "k1"), "/grpc.health.v1.Health/Z")
			require.NoError(t, s.stream(t, "/x.Y/Z", "x-api-key", "k1"), "/x.Y/Z again")
			// The unknown handler ends the stream without a response, which
			// a unary call reports as an error of its own.
			err = s.invoke(t, "/x.Y/Unary", "x-api-key", "k1")
			require.NotEqual(t, codes.ResourceExhausted, status.Code(err), "unary call to an unknown method: %v", err)
			f.mu.Lock()
			got := slices.Clone(f.keys)
			f.mu.Unlock()
			assert.Equal(t, tt.want, got, "keys given to the limiter")
			assert.Equal(t, []string{healthpb.Health_Check_FullMethodName}, s.unaryMethods(), "unary calls past the interceptors")
			assert.Equal(t, int64(4), unknown.Load(), "streams to the unknown handler")
		})
	}
}

func TestMetadataKey(t *testing.T) {
	t.Parallel()
	s := newServer(t, fixedWindow(t), grpclimit.WithKeyFunc(grpclimit.MetadataKey("X-API-Key")))
	steps := []struct {
		key  string
		want codes.Code
	}{
		{"alice", codes.OK},
		{"alice", codes.OK},
		{"bob", codes.OK},
		{"alice", codes.ResourceExhausted},
		{"bob", codes.OK},
		{"bob", codes.ResourceExhausted},
		{"carol", codes.OK},
	}
	for i, st := range steps {
		_, err := s.check(t, "x-api-key", st.key)
		wantCode(t, fmt.Sprintf("step %d, key %q", i+1, st.key), err, st.want)
	}
}

func TestMissingMetadataKey(t *testing.T) {
	t.Parallel()
	var reported atomic.Value
	s := newServer(t, fixedWindow(t),
		grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-api-key")),
		grpclimit.WithOnError(func(_ context.Context, _ string, err error) { reported.Store(err) }),
	)
	_, err := s.check(t)
	wantCode(t, "unary without key", err, codes.InvalidArgument)
	wantCode(t, "stream without key", s.watch(t), codes.InvalidArgument)
	_, err = s.check(t, "x-api-key", "")
	wantCode(t, "empty key", err, codes.InvalidArgument)
	reportedErr, _ := reported.Load().(error)
	assert.ErrorIs(t, reportedErr, grpclimit.ErrNoKey, "got reported error %v, want one wrapping ErrNoKey", reportedErr)
	got := s.calls.Load()
	assert.Zero(t, got, "got %d calls to the handler, want 0", got)
}

func TestKeyFuncError(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("no tenant: %w", grpclimit.ErrNoKey), codes.InvalidArgument},
		{errors.New("tenant store down"), codes.Internal},
		{nil, codes.InvalidArgument}, // empty key
	} {
		var reported atomic.Value
		s := newServer(t, fixedWindow(t),
			grpclimit.WithKeyFunc(func(context.Context, string) (string, error) { return "", tt.err }),
			grpclimit.WithOnError(func(_ context.Context, _ string, err error) { reported.Store(err) }),
		)
		_, err := s.check(t)
		wantCode(t, fmt.Sprintf("KeyFunc error %v", tt.err), err, tt.want)
		got, _ := reported.Load().(error)
		assert.True(t, got != nil && (tt.err == nil || got == tt.err), "KeyFunc error %v: got reported error %v", tt.err, got)
	}
}

func TestKeyFuncStatus(t *testing.T) {
	t.Parallel()
	s := newServer(t, fixedWindow(t), grpclimit.WithKeyFunc(func(context.Context, string) (string, error) {
		return "", status.Error(codes.Unauthenticated, "unknown API key")
	}))
	_, err := s.check(t)
	wantCode(t, "unary", err, codes.Unauthenticated)
}

// fake is a Limiter that answers every call with res and err, and records
// the keys it was asked about.
type fake struct {
	res redlimit.Result
	err error

	mu   sync.Mutex
	keys []string
}

func (f *fake) Allow(ctx context.Context, key string) (redlimit.Result, error) {
	return f.AllowN(ctx, key, 1)
}

func (f *fake) AllowN(_ context.Context, key string, _ int) (redlimit.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, key)
	return f.res, f.err
}

func (f *fake) Wait(ctx context.Context, key string) error { return f.WaitN(ctx, key, 1) }

func (f *fake) WaitN(context.Context, string, int) error { return f.err }

func (f *fake) Reset(context.Context, string) error { return f.err }
func (f *fake) Close() error                        { return nil }

func (f *fake) lastKey() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.keys) == 0 {
		return ""
	}
	return f.keys[len(f.keys)-1]
}

func TestLimiterError(t *testing.T) {
	t.Parallel()
	var reported atomic.Value
	f := &fake{err: errors.New("redlimit: redis unavailable: connection refused")}
	s := newServer(t, f, grpclimit.WithOnError(func(_ context.Context, _ string, err error) { reported.Store(err) }))
	_, err := s.check(t)
	wantCode(t, "unary", err, codes.Unavailable)
	wantCode(t, "stream", s.watch(t), codes.Unavailable)
	got, want := reported.Load(), any(f.err)
	assert.Same(t, want, got, "got reported error %v, want %v", got, want)
	calls := s.calls.Load()
	assert.Zero(t, calls, "got %d calls to the handler, want 0", calls)
}

func TestRedisDown(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerSecond(2), redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	s := newServer(t, lim)
	m.Close()
	_, err = s.check(t)
	wantCode(t, "unary with Redis down", err, codes.Unavailable)
}

func TestKeys(t *testing.T) {
	t.Parallel()
	f := &fake{res: redlimit.Result{Allowed: true, Limit: redlimit.PerSecond(1)}}
	s := newServer(t, f)
	_, err := s.check(t)
	require.NoError(t, err)
	got, want := f.lastKey(), "bufconn:bufconn"
	assert.Equal(t, want, got, "PeerKey on bufconn: got key %q, want %q", got, want)

	s = newServer(t, f, grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-api-key")), grpclimit.WithPerMethod())
	_, err = s.check(t, "x-api-key", "k1")
	require.NoError(t, err)
	got, want = f.lastKey(), "/grpc.health.v1.Health/Check k1"
	assert.Equal(t, want, got, "WithPerMethod: got key %q, want %q", got, want)
}

func TestSkip(t *testing.T) {
	t.Parallel()
	f := &fake{err: errors.New("must not be called")}
	s := newServer(t, f, grpclimit.WithSkip(func(_ context.Context, fullMethod string) bool {
		return fullMethod == "/grpc.health.v1.Health/Check"
	}))
	_, err := s.check(t)
	require.NoError(t, err, "skipped call")
	wantCode(t, "stream not skipped", s.watch(t), codes.Unavailable)
}

func TestWithoutHeaders(t *testing.T) {
	t.Parallel()
	s := newServer(t, fixedWindow(t), grpclimit.WithoutHeaders())
	header, err := s.check(t)
	require.NoError(t, err)
	got := header.Get(grpclimit.HeaderRemaining)
	assert.Empty(t, got, "got %s %q, want none", grpclimit.HeaderRemaining, got)
}

func TestDelay(t *testing.T) {
	t.Parallel()
	const delay = 50 * time.Millisecond
	f := &fake{res: redlimit.Result{Allowed: true, Limit: redlimit.PerSecond(1), Delay: delay}}
	s := newServer(t, f)
	start := time.Now()
	_, err := s.check(t)
	require.NoError(t, err)
	elapsed := time.Since(start)
	assert.GreaterOrEqual(t, elapsed, delay, "call returned after %v, before its Delay %v", elapsed, delay)
	got, want := s.calls.Load(), int64(1)
	assert.Equal(t, want, got, "got %d calls to the handler, want %d", got, want)
}

func TestDelayPastDeadline(t *testing.T) {
	t.Parallel()
	f := &fake{res: redlimit.Result{Allowed: true, Limit: redlimit.PerSecond(1), Delay: time.Hour}}
	s := newServer(t, f)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := s.client.Check(ctx, &healthpb.HealthCheckRequest{})
	wantCode(t, "unary", err, codes.DeadlineExceeded)
	got := s.calls.Load()
	assert.Zero(t, got, "got %d calls to the handler, want 0", got)
}

// A leaky bucket refuses, taking nothing, a slot whose Delay would end
// after the call's deadline: the call is denied with a RetryInfo after
// which it would fit, and the next call finds the slot free.
func TestDelayPastDeadlineRefused(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	m.SetTime(windowStart)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewLeakyBucket(rdb, redlimit.Limit{Rate: 1, Period: 20 * time.Second, Burst: 3}, redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	s := newServer(t, lim)
	header, err := s.check(t) // the first slot: no Delay
	require.NoError(t, err)
	assert.Equal(t, []string{"2"}, header.Get(grpclimit.HeaderRemaining))
	for i := range 2 {
		start := time.Now()
		header, err = s.check(t) // a 10s deadline, a 20s Delay
		elapsed := time.Since(start)
		wantCode(t, "a Delay past the deadline", err, codes.ResourceExhausted)
		assert.Less(t, elapsed, 5*time.Second, "call %d: denied after %v, want at once", i+1, elapsed)
		var retry time.Duration
		for _, d := range status.Convert(err).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				retry = ri.GetRetryDelay().AsDuration()
			}
		}
		// The Delay would be 20s, and the call could wait up to 10s less
		// the time the call took to arrive and a 1ms margin.
		assert.True(t, retry > 10*time.Second && retry <= 11*time.Second, "call %d: RetryInfo %v, want just over 10s", i+1, retry)
		assert.Equal(t, []string{"2"}, header.Get(grpclimit.HeaderRemaining), "call %d: a refused slot was taken", i+1)
	}
	assert.Equal(t, int64(1), s.calls.Load(), "calls that reached the handler")
}

// TestHeadersPerStrategy checks the header metadata of each strategy on a
// real limiter: ratelimit-limit is the quota q of the ratelimit-policy
// entry (q per w whole seconds, as httplimit.Quota), which the remaining
// count never exceeds, for sub-second periods and bursts too.
func TestHeadersPerStrategy(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tt := range []struct {
		strategy         redlimit.Strategy
		limit            redlimit.Limit
		policy           string
		quota, remaining string
	}{
		{redlimit.FixedWindow, redlimit.Limit{Rate: 10, Period: 100 * ms}, `"fixed-window";q=100;w=1`, "100", "9"},
		{redlimit.SlidingLog, redlimit.Limit{Rate: 3, Period: 1500 * ms}, `"sliding-log";q=4;w=2`, "4", "2"},
		{redlimit.SlidingCounter, redlimit.PerMinute(60), `"sliding-counter";q=60;w=60`, "60", "59"},
		{redlimit.SubWindowCounter, redlimit.PerMinute(60), `"sub-window-counter";q=60;w=60`, "60", "59"},
		{redlimit.TokenBucket, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, `"token-bucket";q=20;w=2`, "20", "19"},
		{redlimit.LeakyBucket, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 3}, `"leaky-bucket";q=10;w=1`, "10", "2"},
	} {
		t.Run(tt.strategy.String(), func(t *testing.T) {
			t.Parallel()
			m := miniredis.RunT(t)
			m.SetTime(windowStart)
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { rdb.Close() })
			lim, err := redlimit.New(rdb, tt.strategy, tt.limit, redlimit.WithFallback(redlimit.FallbackError))
			require.NoError(t, err)
			t.Cleanup(func() { lim.(*redlimit.RateLimiter).Close() })
			header, err := newServer(t, lim).check(t)
			require.NoError(t, err)
			assert.Equal(t, []string{tt.policy}, header.Get(grpclimit.HeaderPolicy), "%v", tt.limit)
			assert.Equal(t, []string{tt.quota}, header.Get(grpclimit.HeaderLimit), "%v", tt.limit)
			assert.Equal(t, []string{tt.remaining}, header.Get(grpclimit.HeaderRemaining), "%v", tt.limit)
		})
	}
}

func TestHeadersWithoutLimit(t *testing.T) {
	t.Parallel()
	f := &fake{res: redlimit.Result{Allowed: true, Remaining: 3, ResetAfter: time.Second}}
	header, err := newServer(t, f).check(t)
	require.NoError(t, err)
	assert.Empty(t, header.Get(grpclimit.HeaderPolicy), "no Limit, no policy")
	assert.Empty(t, header.Get(grpclimit.HeaderLimit), "no Limit, no quota")
	assert.Equal(t, []string{"3"}, header.Get(grpclimit.HeaderRemaining))

	f = &fake{res: redlimit.Result{Allowed: true, Limit: redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, Remaining: 19}}
	header, err = newServer(t, f).check(t)
	require.NoError(t, err)
	assert.Equal(t, []string{`"default";q=20;w=2`}, header.Get(grpclimit.HeaderPolicy), "a Limiter without a strategy")
	assert.Equal(t, []string{"20"}, header.Get(grpclimit.HeaderLimit), "a Limiter without a strategy")
}
