package grpclimit_test

import (
	"context"
	"net"
	"strconv"
	"sync"
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
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// funcHealth is a Health server whose Check and Watch run the functions
// given: a handler of the test's choosing on a real gRPC server.
type funcHealth struct {
	healthpb.UnimplementedHealthServer
	check func(ctx context.Context) error
	watch func(ctx context.Context) error
}

func (h *funcHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := h.check(ctx); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *funcHealth) Watch(_ *healthpb.HealthCheckRequest, ss healthpb.Health_WatchServer) error {
	if err := h.watch(ss.Context()); err != nil {
		return err
	}
	return ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// serveFunc starts a gRPC server on bufconn with the interceptors and h,
// and returns a client of it.
func serveFunc(t *testing.T, unary grpc.UnaryServerInterceptor, stream grpc.StreamServerInterceptor, h *funcHealth) healthpb.HealthClient {
	t.Helper()
	lis := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
	healthpb.RegisterHealthServer(srv, h)
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
	return healthpb.NewHealthClient(conn)
}

// costRig is a Policy of "requests" (100 per minute, a token bucket taking
// one per call) and "tokens" (1000 per hour, a fixed window) on a
// miniredis standing at the start of an hour, and a limiter that shares
// the tokens rule's state: it reads what Redis holds for the tokens.
type costRig struct {
	p      *redlimit.Policy
	tokens redlimit.Limiter
}

func newCostRig(t *testing.T) *costRig {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(hourStart)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	p, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "requests", Strategy: redlimit.TokenBucket, Limit: redlimit.PerMinute(100), PerCall: true},
		{Name: "tokens", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(1000)},
	}, redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	tokens, err := redlimit.New(rdb, redlimit.FixedWindow, redlimit.PerHour(1000), redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { tokens.Close() })
	return &costRig{p: p, tokens: tokens}
}

func (c *costRig) tokensUsed(t *testing.T, key string) int {
	t.Helper()
	res, err := c.tokens.AllowN(context.Background(), key, 0)
	require.NoError(t, err)
	return 1000 - res.Remaining
}

// maxTokens is a cost function: the call's x-max-tokens metadata.
func maxTokens(ctx context.Context, _ string) int {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-max-tokens"); len(v) == 1 {
		n, _ := strconv.Atoi(v[0])
		return n
	}
	return 1
}

func costOpts() []grpclimit.Option {
	return []grpclimit.Option{grpclimit.WithCost(maxTokens), grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-tenant"))}
}

func tenantCtx(t *testing.T, tenant string, maxTok int) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "x-tenant", tenant, "x-max-tokens", strconv.Itoa(maxTok))
}

// Unary and stream calls are settled with what the handler reported
// through its context, or with the reserved cost when it reported none:
// Redis then holds the reported cost, not the reserved one.
func TestCostSettled(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	var seen int
	h := &funcHealth{
		check: func(ctx context.Context) error {
			md, _ := metadata.FromIncomingContext(ctx)
			if md.Get("x-tenant")[0] == "quiet" {
				return nil
			}
			seen = rig.tokensUsed(t, "reported")
			grpclimit.Report(ctx, 80)
			grpclimit.Report(ctx, 120) // the last report counts
			return nil
		},
		watch: func(ctx context.Context) error {
			grpclimit.Report(ctx, 70)
			return nil
		},
	}
	client := serveFunc(t, grpclimit.UnaryServerInterceptor(rig.p, costOpts()...), grpclimit.StreamServerInterceptor(rig.p, costOpts()...), h)
	_, err := client.Check(tenantCtx(t, "reported", 500), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, 500, seen, "tokens held while the handler runs")
	assert.Equal(t, 120, rig.tokensUsed(t, "reported"), "unary: tokens held once settled")

	_, err = client.Check(tenantCtx(t, "quiet", 300), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, 300, rig.tokensUsed(t, "quiet"), "nothing reported: the reserved cost")

	stream, err := client.Watch(tenantCtx(t, "stream", 400), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rig.tokensUsed(t, "stream") == 70 }, 5*time.Second, 5*time.Millisecond,
		"stream: tokens held once settled")
}

// A cancelled call is settled; a handler that panics is settled with what
// it reported, and the panic goes on.
func TestCostSettledCancelAndPanic(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	var settleErrs []error
	opts := append(costOpts(), grpclimit.WithOnError(func(_ context.Context, _ string, err error) { settleErrs = append(settleErrs, err) }))
	started := make(chan struct{})
	h := &funcHealth{check: func(ctx context.Context) error {
		close(started)
		<-ctx.Done() // the client goes away
		grpclimit.Report(ctx, 10)
		return ctx.Err()
	}}
	unary := grpclimit.UnaryServerInterceptor(rig.p, opts...)
	client := serveFunc(t, unary, grpclimit.StreamServerInterceptor(rig.p, opts...), h)
	ctx, cancel := context.WithCancel(tenantCtx(t, "cancel", 400))
	go func() { <-started; cancel() }()
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Canceled, status.Code(err))
	require.Eventually(t, func() bool { return rig.tokensUsed(t, "cancel") == 10 }, 5*time.Second, 5*time.Millisecond,
		"a cancelled call is settled")

	// grpc-go does not recover a handler's panic: the interceptor is
	// called directly.
	in := metadata.NewIncomingContext(context.Background(), metadata.Pairs("x-tenant", "panic", "x-max-tokens", "400"))
	info := &grpc.UnaryServerInfo{FullMethod: healthpb.Health_Check_FullMethodName}
	require.PanicsWithValue(t, "handler bug", func() {
		_, _ = unary(in, nil, info, func(ctx context.Context, _ any) (any, error) {
			grpclimit.Report(ctx, 50)
			panic("handler bug")
		})
	})
	assert.Equal(t, 50, rig.tokensUsed(t, "panic"), "settled with the report made before the panic")
	assert.Empty(t, settleErrs)
}

// A call denied by the tokens rule of a Policy gets the tokens rule's
// metadata and RetryInfo.
func TestCostDeniedFieldsOfDenyingRule(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	h := &funcHealth{check: func(context.Context) error { return nil }}
	client := serveFunc(t, grpclimit.UnaryServerInterceptor(rig.p, costOpts()...), grpclimit.StreamServerInterceptor(rig.p, costOpts()...), h)
	_, err := client.Check(tenantCtx(t, "t", 600), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	var header metadata.MD
	_, err = client.Check(tenantCtx(t, "t", 600), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	st := status.Convert(err)
	require.Equal(t, codes.ResourceExhausted, st.Code())
	wantHeaders(t, "denied", header, `"requests";q=100;w=60, "tokens";q=1000;w=3600`, "1000", "400", "3600", "3600")
	require.Len(t, st.Details(), 1)
	assert.Equal(t, time.Hour, st.Details()[0].(*errdetails.RetryInfo).GetRetryDelay().AsDuration())
	assert.Equal(t, 600, rig.tokensUsed(t, "t"), "the denied call took nothing")

	// Metadata gives the same for a handler's own decision.
	resv, err := rig.p.Reserve(context.Background(), "t", 600)
	require.NoError(t, err)
	md := grpclimit.Metadata(rig.p, resv.Result())
	wantHeaders(t, "Metadata", md, `"requests";q=100;w=60, "tokens";q=1000;w=3600`, "1000", "400", "3600", "3600")
}

func TestCostNeedsReserve(t *testing.T) {
	t.Parallel()
	require.PanicsWithValue(t, "grpclimit: WithCost needs a limiter with Reserve, such as a redlimit.RateLimiter or redlimit.Policy",
		func() { grpclimit.UnaryServerInterceptor(noReserve{}, grpclimit.WithCost(maxTokens)) })
}

// noReserve is a Limiter without Reserve.
type noReserve struct{ redlimit.Limiter }

// A cost above what a rule can ever hold (5,000 tokens against 1,000 an
// hour) is the client's error: codes.InvalidArgument with a message that
// says so, not the Unavailable of a broken limiter; nothing is taken, the
// handler does not run, and WithOnError gets the error, which wraps
// redlimit.ErrExceedsLimit.
func TestCostAboveCapacity(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	var errs []error
	opts := append(costOpts(), grpclimit.WithOnError(func(_ context.Context, _ string, err error) { errs = append(errs, err) }))
	ran := false
	h := &funcHealth{check: func(context.Context) error { ran = true; return nil }, watch: func(context.Context) error { ran = true; return nil }}
	client := serveFunc(t, grpclimit.UnaryServerInterceptor(rig.p, opts...), grpclimit.StreamServerInterceptor(rig.p, opts...), h)
	_, err := client.Check(tenantCtx(t, "t", 5000), &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	assert.Equal(t, codes.InvalidArgument, st.Code(), "unary: %v", err)
	assert.Equal(t, "grpclimit: the call costs more than the rate limit allows at once", st.Message())
	stream, err := client.Watch(tenantCtx(t, "t", 5000), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = stream.Recv()
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "stream: %v", err)
	assert.False(t, ran, "the handler ran")
	assert.Equal(t, 0, rig.tokensUsed(t, "t"), "tokens taken")
	require.Len(t, errs, 2)
	for _, err := range errs {
		assert.ErrorIs(t, err, redlimit.ErrExceedsLimit)
	}
}

// A reported overspend on a sliding log is charged as far as the log takes
// it in one settle (min(used-n, Rate) entries, at most
// redlimit.MaxSlidingLogN), and the settle succeeds: a call reserving 10
// that reported 1,200 at 5,000 an hour was charged 10 (its settle refused,
// seen only by WithOnError), one reporting 1,000 was charged 1,000.
func TestCostSlidingLogOverspend(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	m.SetTime(hourStart)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewSlidingLog(rdb, redlimit.PerHour(5000), redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	var mu sync.Mutex
	var settleErrs []error
	opts := append(costOpts(), grpclimit.WithOnError(func(_ context.Context, _ string, err error) {
		mu.Lock()
		settleErrs = append(settleErrs, err)
		mu.Unlock()
	}))
	h := &funcHealth{check: func(ctx context.Context) error {
		md, _ := metadata.FromIncomingContext(ctx)
		n, _ := strconv.Atoi(md.Get("x-tenant")[0])
		grpclimit.Report(ctx, n)
		return nil
	}}
	client := serveFunc(t, grpclimit.UnaryServerInterceptor(lim, opts...), grpclimit.StreamServerInterceptor(lim, opts...), h)
	for _, tc := range []struct {
		reported, charged int
	}{{1000, 1000}, {1200, 1010}} {
		tenant := strconv.Itoa(tc.reported)
		_, err := client.Check(tenantCtx(t, tenant, 10), &healthpb.HealthCheckRequest{})
		require.NoError(t, err)
		res, err := lim.AllowN(context.Background(), tenant, 0)
		require.NoError(t, err)
		assert.Equal(t, tc.charged, 5000-res.Remaining, "reserved 10, reported %d: charged", tc.reported)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, settleErrs)
}
