package grpclimit

import (
	"context"
	"fmt"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/holdhint"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// DefaultRetryAfterHint is the retry delay that the concurrency
// interceptors give before they have seen a call end, unless
// [WithRetryAfterHint] sets another.
const DefaultRetryAfterHint = time.Second

// WithRetryAfterHint sets the retry delay that [ConcurrencyUnaryServerInterceptor]
// and [ConcurrencyStreamServerInterceptor] give a denied call before any
// call they let through has ended (after that, from the average time calls
// held their lease). The default is [DefaultRetryAfterHint], 1s; d must be
// positive (the constructors panic otherwise). It changes nothing in the
// rate-limit interceptors.
func WithRetryAfterHint(d time.Duration) Option {
	return optionFunc(func(c *config) { c.retryHint = d })
}

// ConcurrencyUnaryServerInterceptor returns an interceptor that holds a
// lease of c for each unary call while its handler runs: at most c's max
// calls per key at once, across every instance. The key is found as for
// [UnaryServerInterceptor] (WithKeyFunc, WithPerMethod, WithSkip apply).
// The lease is taken with TryAcquire (no wait) and released when the
// handler returns, also when it panics (the panic goes on) or the call was
// cancelled. The handler finds it with [LeaseFromContext], to Extend it
// when its work may outlast the lease ttl.
//
// A call with no free slot fails with codes.ResourceExhausted and a
// RetryInfo detail whose delay says when a slot is likely free: the
// average time the calls it let through held their lease (a moving average
// over the last few dozen) divided by the key's max, about when the first
// of max holders ends (before any call ended, [WithRetryAfterHint]'s 1s),
// never more than the time until the oldest lease expires; and, unless
// [WithoutHeaders], the [HeaderRetryAfter] metadata in whole seconds. It is
// not the lease ttl, which only bounds a crashed holder's slot. TryAcquire's
// errors fail the call with codes.Unavailable (see [WithOnError]). It
// panics if c is nil.
func ConcurrencyUnaryServerInterceptor(c *redlimit.Concurrency, opts ...Option) grpc.UnaryServerInterceptor {
	in := newConcurrencyInterceptor(c, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		setHeader := func(md metadata.MD) error { return grpc.SetHeader(ctx, md) }
		held, err := in.acquire(ctx, info.FullMethod, true, setHeader)
		if err != nil {
			return nil, err
		}
		if held != nil {
			defer held.release()
			ctx = context.WithValue(ctx, leaseKey{}, held.lease)
		}
		return handler(ctx, req)
	}
}

// ConcurrencyStreamServerInterceptor is [ConcurrencyUnaryServerInterceptor]
// for streams: the lease is held from the stream's opening until its
// handler returns. It panics if c is nil.
func ConcurrencyStreamServerInterceptor(c *redlimit.Concurrency, opts ...Option) grpc.StreamServerInterceptor {
	in := newConcurrencyInterceptor(c, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		held, err := in.acquire(ss.Context(), info.FullMethod, srv != nil, ss.SetHeader)
		if err != nil {
			return err
		}
		if held != nil {
			defer held.release()
			ss = &ctxStream{ServerStream: ss, ctx: context.WithValue(ss.Context(), leaseKey{}, held.lease)}
		}
		return handler(srv, ss)
	}
}

type leaseKey struct{}

// LeaseFromContext returns the lease that a concurrency interceptor holds
// for the call whose context is ctx (a stream's Context()), and whether
// there is one. The interceptor releases it when the handler returns; the
// handler may Extend it.
func LeaseFromContext(ctx context.Context) (*redlimit.Lease, bool) {
	l, ok := ctx.Value(leaseKey{}).(*redlimit.Lease)
	return l, ok
}

// concurrencyInterceptor is what the concurrency interceptors share.
type concurrencyInterceptor struct {
	interceptor // the key, skip, headers and onError options
	c           *redlimit.Concurrency
	hint        *holdhint.Hint
}

func newConcurrencyInterceptor(c *redlimit.Concurrency, opts []Option) *concurrencyInterceptor {
	if c == nil {
		panic("grpclimit: nil Concurrency")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.retryHint <= 0 {
		panic(fmt.Sprintf("grpclimit: Retry-After hint %v is not positive", cfg.retryHint))
	}
	return &concurrencyInterceptor{interceptor: interceptor{cfg: cfg}, c: c, hint: holdhint.New(cfg.retryHint)}
}

// releaser is a call's lease: release gives it back and counts how long
// it was held.
type releaser struct {
	lease *redlimit.Lease
	start time.Time
	ctx   context.Context
	hint  *holdhint.Hint
}

func (r *releaser) release() {
	r.hint.Observe(time.Since(r.start))
	// Release works on a cancelled context, bounded by 1s.
	_ = r.lease.Release(r.ctx)
}

// acquire takes a lease for one call to fullMethod. It returns the lease
// held (nil for a skipped call), or the status error to fail the call
// with.
func (in *concurrencyInterceptor) acquire(ctx context.Context, fullMethod string, registered bool, setHeader func(metadata.MD) error) (*releaser, error) {
	key, skip, err := in.key(ctx, fullMethod, registered)
	if skip || err != nil {
		return nil, err
	}
	lease, res, err := in.c.TryAcquire(ctx, key)
	if err != nil {
		return nil, in.limiterError(ctx, fullMethod, err, "grpclimit: concurrency limiter unavailable")
	}
	if lease == nil {
		retry := in.hint.RetryAfter(res.RetryAfter, res.Limit.Rate)
		if in.cfg.headers {
			_ = setHeader(metadata.Pairs(HeaderRetryAfter, seconds(max(retry, time.Second))))
		}
		st := status.New(codes.ResourceExhausted,
			fmt.Sprintf("grpclimit: %d calls at once, retry after %v", res.Limit.Rate, retry))
		if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
			st = withInfo
		}
		return nil, st.Err()
	}
	return &releaser{lease: lease, start: time.Now(), ctx: ctx, hint: in.hint}, nil
}
