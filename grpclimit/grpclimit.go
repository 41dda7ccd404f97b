// Package grpclimit rate-limits gRPC servers with a [redlimit.Limiter].
//
// [UnaryServerInterceptor] and [StreamServerInterceptor] ask the limiter
// once per call, before the handler runs. A stream counts as one call when
// it opens; its messages are not counted. The key of a call comes from a
// [KeyFunc]: by default [PeerKey], the client's IP address; [IPKey] finds
// that address behind proxies, from the one metadata entry they set;
// [MetadataKey] reads the key from request metadata such as "x-api-key";
// [WithKeyFunc] takes any function, and [WithPerMethod] gives every
// registered method its own limit.
//
//	lim, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(10))
//	if err != nil {
//		return err
//	}
//	defer lim.Close()
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(lim)),
//		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(lim)),
//	)
//
// # Method names
//
// A server with a grpc.UnknownServiceHandler, as gRPC proxies have, gets
// calls to methods it did not register under whatever name the client
// sends: grpc-go hands each of them, unary or not, to that handler as a
// stream, and to the stream interceptor with the client's name as its full
// method. [WithPerMethod] gives only the registered methods a limit each;
// all the others share one limit per key, under [UnknownMethod], so made-up
// names neither escape the limit nor fill Redis with keys. A [KeyFunc] or a
// [WithSkip] function gets the name as sent: do not put it in a key, and
// compare it with whole method names, not prefixes.
//
// # Status codes
//
// Calls that the interceptors stop fail with these codes:
//
//   - Denied by the limit: codes.ResourceExhausted, with a google.rpc.RetryInfo
//     detail (errdetails.RetryInfo) whose retry_delay is
//     [redlimit.Result.RetryAfter]. Clients read it with status.Convert(err)
//     and Status.Details.
//   - No key: codes.InvalidArgument when the KeyFunc's error wraps
//     [ErrNoKey] (the call lacks what identifies its client, such as the
//     metadata that [MetadataKey] wants) or the key is "", with the error as
//     message. Any other KeyFunc error is a server fault: codes.Internal,
//     with a fixed message; see [WithOnError] to log it. A KeyFunc that
//     needs another code returns a gRPC status error (status.Error), whose
//     code and message are used as is: codes.Unauthenticated for an unknown
//     API key, say.
//   - The limiter failed (an error from AllowN, such as Redis down with
//     redlimit.FallbackError): codes.Unavailable, with a fixed message that
//     does not reveal the cause; see [WithOnError] to log it. It is never
//     codes.ResourceExhausted, so clients can tell "slow down" from
//     "broken", and retry policies that retry Unavailable do so.
//   - A cost above what a rule can ever hold at once ([WithCost]; an error
//     wrapping redlimit.ErrExceedsLimit): codes.InvalidArgument, with the
//     message "grpclimit: the call costs more than the rate limit allows at
//     once", since waiting never admits it; [WithOnError] gets the error,
//     and the limiter's observer sees it (see redlimit.WithObserver).
//   - The call's context ended first (while deciding, or during a
//     LeakyBucket Delay): codes.Canceled or codes.DeadlineExceeded.
//
// A call that is allowed, including one allowed in shadow mode or decided
// by the fallback while Redis is down, goes on to the handler. When the
// limiter asks for a Delay (LeakyBucket), the interceptor sleeps that long
// before calling the handler. A call with a deadline is never given a Delay
// that ends after it: the interceptor tells a limiter of this module how
// long the call can wait, and a leaky bucket refuses the slot, taking
// nothing, so the call is denied as above, with a RetryInfo delay after
// which the Delay would fit. (A Limiter of another kind may give such a
// Delay: the call then fails when its context ends, as above, and its slot
// stays taken.) A call without a deadline waits the whole Delay, unless it
// is canceled, which leaves its slot taken. Give calls a deadline.
//
// # Response headers
//
// Unless [WithoutHeaders] is given, every call that reaches a decision,
// allowed or denied, gets response header metadata: [HeaderPolicy],
// [HeaderLimit], [HeaderRemaining] and [HeaderReset], and on a denial
// [HeaderRetryAfter]. Clients read them with the grpc.Header call option
// (unary) or ClientStream.Header. For a token bucket of 10 per second with
// a Burst of 20, after one call:
//
//	ratelimit-policy: "token-bucket";q=20;w=2
//	ratelimit-limit: 20
//	ratelimit-remaining: 19
//	ratelimit-reset: 1
//
// The policy is httplimit's RateLimit-Policy field, byte for byte (see
// httplimit.Quota): q events per w whole seconds at the limit's steady
// rate, q at least what ratelimit-remaining can show. A single-strategy
// limiter has one policy, named after its strategy ("fixed-window",
// "sliding-log", "sliding-counter", "token-bucket", "leaky-bucket",
// "sub-window-counter"), or "default" for a Limiter that does not report
// one.
//
// A [redlimit.Policy] has one policy per rule, in the order of its rules,
// each named after the rule (Rule.Name, or its default name such as
// "token-bucket-1s"; bytes that are not printable ASCII become '_', and
// a name that is then another's gets "-2", "-3"...), all
// in the one ratelimit-policy entry as a list. The other entries describe
// the rule that decided (Result.Rule): ratelimit-limit is its q, and
// ratelimit-remaining, ratelimit-reset and retry-after are the Result's.
// For the rules {"second": 10 per second, token bucket; "hour": 1000 per
// hour, fixed window}, after one call at the start of an hour:
//
//	ratelimit-policy: "second";q=10;w=1, "hour";q=1000;w=3600
//	ratelimit-limit: 10
//	ratelimit-remaining: 9
//	ratelimit-reset: 3600
//
// ratelimit-reset is when the key is back at its full allowance under
// every rule: here the hour. Every policy is a limit the call was decided
// by: with [redlimit.WithLimitFunc], the limit it gave for the call's key,
// and with [redlimit.WithRulesFunc], every rule it gave (a paid plan's
// rules for a paid caller), not the limiter's own.
//
// # Costs and concurrency
//
// [WithCost] reserves a call's estimated cost before the handler and
// settles what the handler passed to [Report] when it returns. [Metadata]
// gives the metadata of a Result that a handler decided itself.
// [ConcurrencyUnaryServerInterceptor] and [ConcurrencyStreamServerInterceptor]
// hold a lease of a [redlimit.Concurrency] while the handler runs.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/calldelay"
	"github.com/redlimit/redlimit/internal/errprefix"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Names of the response header metadata set on every decided call (see
// [WithoutHeaders]). gRPC metadata keys are lowercase. The values are
// decimal integers, after the IETF RateLimit header fields and HTTP's
// Retry-After, except HeaderPolicy's.
const (
	// HeaderPolicy is the quota policy, as HTTP's RateLimit-Policy field
	// (draft-ietf-httpapi-ratelimit-headers) writes it:
	// `"<name>";q=<quota>;w=<window seconds>`, the name being the
	// limiter's strategy ("token-bucket"), or "default" for a Limiter that
	// does not report one; for a [redlimit.Policy], a list of one such
	// policy per rule, named after the rules, separated by ", ". See
	// httplimit.Quota for q and w. Left out when no policy has a usable
	// Limit.
	HeaderPolicy = "ratelimit-policy"
	// HeaderLimit is the quota q of the policy in HeaderPolicy that
	// decided (a Policy's deciding rule): the events allowed per window of
	// its w seconds, at least the most that HeaderRemaining can show (Rate
	// for the windows, Burst for the buckets). Left out when that policy
	// has no usable Limit.
	HeaderLimit = "ratelimit-limit"
	// HeaderRemaining is Result.Remaining: the calls that could still be
	// allowed now for the same key.
	HeaderRemaining = "ratelimit-remaining"
	// HeaderReset is Result.RuleResetAfter (ResetAfter for a Result that
	// names no rule) in whole seconds, rounded up:
	// when the policy that decided (a Policy's deciding rule, whose quota
	// HeaderLimit is) is back at its full allowance without more traffic.
	HeaderReset = "ratelimit-reset"
	// HeaderRetryAfter is Result.RetryAfter in whole seconds, rounded up and
	// at least 1; set on denials only. The RetryInfo detail of the status
	// has the exact value.
	HeaderRetryAfter = "retry-after"
)

// UnknownMethod is the method part of the keys that [WithPerMethod] gives
// calls to methods the server did not register: "unknown 192.0.2.1" for
// every call of client 192.0.2.1 that reaches the server's
// grpc.UnknownServiceHandler. Full method names begin with "/", so it is
// never a registered method's.
const UnknownMethod = "unknown"

// ErrNoKey is wrapped by the errors of the KeyFuncs of this package when a
// call has no key: no peer address, or no metadata of the wanted name. Wrap
// it in your own KeyFunc's errors for the same outcome: such calls fail
// with codes.InvalidArgument. The interceptors also wrap it when a KeyFunc
// returns an empty key.
var ErrNoKey = errors.New("grpclimit: no rate-limit key")

// Option configures an interceptor. Options are applied in order, so a
// later one wins.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config holds every option, with its default set in defaultConfig.
type config struct {
	keyFunc   KeyFunc
	perMethod bool
	headers   bool
	skip      func(ctx context.Context, fullMethod string) bool
	onError   func(ctx context.Context, fullMethod string, err error)
	cost      func(ctx context.Context, fullMethod string) int // WithCost: see cost.go
	retryHint time.Duration                                    // WithRetryAfterHint: see concurrency.go
	priority  func(ctx context.Context, fullMethod string) redlimit.Priority
}

func defaultConfig() config {
	return config{
		keyFunc:   PeerKey,
		headers:   true,
		retryHint: DefaultRetryAfterHint,
	}
}

// WithKeyFunc sets how the key of a call is found. The default is
// [PeerKey]; nil restores it. See [KeyFunc] for how its errors become
// status codes.
func WithKeyFunc(f KeyFunc) Option {
	return optionFunc(func(c *config) {
		if f == nil {
			f = PeerKey
		}
		c.keyFunc = f
	})
}

// WithPerMethod gives every method the server registered its own limit:
// the key passed to the limiter becomes the full method name, a space and
// the KeyFunc's key, as in "/grpc.health.v1.Health/Check 192.0.2.1". Calls
// to any other method, which reach a grpc.UnknownServiceHandler under a
// name that the client chose, share one limit per key instead, with
// [UnknownMethod] as the method part: "unknown 192.0.2.1". A client thus
// gets no fresh limit, and makes no new Redis key, by making up names.
// Without WithPerMethod (the default), all methods guarded by the
// interceptor share one limit per key. Call Limiter.Reset with the same
// combined key to clear it.
//
// The interceptors tell registered methods from the others by what
// grpc-go gives them: a unary interceptor sees registered methods only,
// and a stream interceptor gets the service implementation as srv for a
// registered method and nil for the unknown service handler. The streams
// of a service registered with a nil implementation therefore count as
// unknown; they are still limited, only not apart from the unknown ones.
func WithPerMethod() Option {
	return optionFunc(func(c *config) { c.perMethod = true })
}

// WithoutHeaders stops the interceptor from setting the response header
// metadata [HeaderPolicy], [HeaderLimit], [HeaderRemaining], [HeaderReset]
// and [HeaderRetryAfter]. By default they are set.
func WithoutHeaders() Option {
	return optionFunc(func(c *config) { c.headers = false })
}

// WithSkip exempts calls from the limit: when skip returns true, the call
// goes to the handler without a key or a limiter call. By default no call
// is skipped. For example, to leave health checks alone:
//
//	grpclimit.WithSkip(func(_ context.Context, fullMethod string) bool {
//		return fullMethod == healthpb.Health_Check_FullMethodName ||
//			fullMethod == healthpb.Health_Watch_FullMethodName
//	})
//
// Compare whole names: on a server with a grpc.UnknownServiceHandler, a
// client can send any name, such as "/grpc.health.v1.Health/Anything",
// and a prefix would let it past the limit.
func WithSkip(skip func(ctx context.Context, fullMethod string) bool) Option {
	return optionFunc(func(c *config) { c.skip = skip })
}

// WithOnError sets a function called with every error that makes a call
// fail other than a denial: a KeyFunc error, or a limiter error, before
// the call fails with codes.InvalidArgument, codes.Internal or
// codes.Unavailable. Use it to
// log or count them; it must be safe for concurrent use. The default is
// none.
func WithOnError(f func(ctx context.Context, fullMethod string, err error)) Option {
	return optionFunc(func(c *config) { c.onError = f })
}

// WithPriority sets the function that gives each call its priority, put
// on the limiter call's context with [redlimit.ContextWithPriority]: with
// [redlimit.WithPriorityShares], Sheddable calls (batch work) may use only
// a share of the limit and Critical ones (health checks, payments) all of
// it. The default is none: the priority already on the call's context,
// if any, else Normal.
func WithPriority(f func(ctx context.Context, fullMethod string) redlimit.Priority) Option {
	return optionFunc(func(c *config) { c.priority = f })
}

// UnaryServerInterceptor returns an interceptor that asks l for each unary
// call and fails the calls it denies; see the package documentation for
// the status codes and headers. It panics if l is nil.
func UnaryServerInterceptor(l redlimit.Limiter, opts ...Option) grpc.UnaryServerInterceptor {
	in := newInterceptor(l, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		setHeader := func(md metadata.MD) error { return grpc.SetHeader(ctx, md) }
		// grpc-go calls unary interceptors for registered methods only.
		resv, err := in.limit(ctx, info.FullMethod, true, setHeader)
		if err != nil {
			return nil, err
		}
		if resv != nil {
			// Settled when the handler returns, also when it panics.
			var st *costState
			ctx, st = withCost(ctx)
			defer in.settle(ctx, info.FullMethod, resv, st)
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns an interceptor that asks l once for each
// stream, when it opens, and fails the streams it denies before the handler
// runs; see the package documentation for the status codes and headers. It
// panics if l is nil.
func StreamServerInterceptor(l redlimit.Limiter, opts ...Option) grpc.StreamServerInterceptor {
	in := newInterceptor(l, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		// grpc-go gives the unknown service handler's streams a nil srv,
		// and those of registered methods their service implementation.
		resv, err := in.limit(ss.Context(), info.FullMethod, srv != nil, ss.SetHeader)
		if err != nil {
			return err
		}
		if resv != nil {
			ctx, st := withCost(ss.Context())
			defer in.settle(ctx, info.FullMethod, resv, st)
			ss = &ctxStream{ServerStream: ss, ctx: ctx}
		}
		return handler(srv, ss)
	}
}

// interceptor is what the unary and stream interceptors share.
type interceptor struct {
	lim      redlimit.Limiter
	cfg      config
	policies ratelimitfields.Source
	reserver ratelimitfields.Reserver // WithCost: lim; else nil
}

func newInterceptor(l redlimit.Limiter, opts []Option) *interceptor {
	if l == nil {
		panic("grpclimit: nil Limiter")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	// The policies of httplimit's RateLimit-Policy field, which has no
	// WithPolicyName here.
	policies := ratelimitfields.NewSource(l, "", false, httplimit.DefaultPolicyName)
	return &interceptor{lim: l, cfg: cfg, policies: policies, reserver: reserverOf(l, cfg.cost)}
}

// limit decides one call to fullMethod, registered telling whether the
// server registered it. It returns a nil error when the handler may run,
// or the status error to fail the call with; with WithCost, the
// reservation to settle when the handler returns (nil for a skipped call).
func (in *interceptor) limit(ctx context.Context, fullMethod string, registered bool, setHeader func(metadata.MD) error) (*reservation, error) {
	key, skip, err := in.key(ctx, fullMethod, registered)
	if skip || err != nil {
		return nil, err
	}
	callCtx := ctx
	if in.cfg.priority != nil {
		callCtx = redlimit.ContextWithPriority(callCtx, in.cfg.priority(ctx, fullMethod))
	}
	if deadline, ok := ctx.Deadline(); ok {
		// A leaky bucket then refuses, taking nothing, a slot whose Delay
		// would end after the call's deadline (the limiter keeps a margin
		// for the round trip, as WaitN does).
		callCtx = calldelay.Until(callCtx, deadline)
	}
	var (
		res   redlimit.Result
		rules []redlimit.Rule
		resv  *reservation
	)
	if in.reserver != nil {
		resv = &reservation{n: in.cfg.cost(ctx, fullMethod)}
		resv.Reservation, rules, err = in.policies.Reserve(callCtx, in.reserver, key, resv.n)
		res = resv.Result()
	} else {
		res, rules, err = in.policies.Allow(callCtx, in.lim, key)
	}
	if err != nil {
		if errors.Is(err, redlimit.ErrExceedsLimit) {
			// A cost that can never fit: the client's error.
			in.report(ctx, fullMethod, err)
			return nil, status.Error(codes.InvalidArgument, "grpclimit: the call costs more than the rate limit allows at once")
		}
		return nil, in.limiterError(ctx, fullMethod, err, "grpclimit: rate limiter unavailable")
	}
	if in.cfg.headers {
		// It fails only when headers were already sent, which cannot
		// happen before the handler runs.
		_ = setHeader(in.headers(res, rules))
	}
	if !res.Allowed {
		return nil, denied(res)
	}
	if err := sleep(ctx, res.Delay); err != nil {
		in.settleUsed(ctx, fullMethod, resv, 0) // nothing used
		return nil, status.FromContextError(err).Err()
	}
	return resv, nil
}

// key returns the key of a call to fullMethod, or the status error to
// fail the call with; skip is true, with no key looked for, for a call
// that WithSkip exempts.
func (in *interceptor) key(ctx context.Context, fullMethod string, registered bool) (key string, skip bool, err error) {
	if in.cfg.skip != nil && in.cfg.skip(ctx, fullMethod) {
		return "", true, nil
	}
	key, err = in.cfg.keyFunc(ctx, fullMethod)
	if err == nil && key == "" {
		err = errprefix.Errorf("grpclimit: ", "%s: empty key: %w", fullMethod, ErrNoKey)
	}
	if err != nil {
		in.report(ctx, fullMethod, err)
		return "", false, keyError(ctx, err)
	}
	if in.cfg.perMethod {
		// Only registered names: any other is the client's choice.
		method := UnknownMethod
		if registered {
			method = fullMethod
		}
		key = method + " " + key
	}
	return key, false, nil
}

func (in *interceptor) report(ctx context.Context, fullMethod string, err error) {
	if in.cfg.onError != nil {
		in.cfg.onError(ctx, fullMethod, err)
	}
}

// limiterError reports err, a limiter's error on a call to fullMethod,
// and returns the status error to fail the call with: that of its
// context if it ended, else codes.Unavailable with msg, which does not
// reveal the cause.
func (in *interceptor) limiterError(ctx context.Context, fullMethod string, err error, msg string) error {
	in.report(ctx, fullMethod, err)
	if ctxErr := ctx.Err(); ctxErr != nil {
		return status.FromContextError(ctxErr).Err()
	}
	return status.Error(codes.Unavailable, msg)
}

// keyError turns a KeyFunc error into the status error a call fails with.
func keyError(ctx context.Context, err error) error {
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	if errors.Is(err, ErrNoKey) {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return status.FromContextError(ctxErr).Err()
	}
	return status.Error(codes.Internal, "grpclimit: cannot find the rate-limit key")
}

// denied returns the ResourceExhausted status error of a denial, with a
// RetryInfo detail.
func denied(res redlimit.Result) error {
	st := status.New(codes.ResourceExhausted,
		fmt.Sprintf("grpclimit: rate limit %v exceeded, retry after %v", res.Limit, res.RetryAfter))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// headers returns the response header metadata for a decision. rules are
// those that decided a redlimit.Policy's call (see ratelimitfields.Source).
func (in *interceptor) headers(res redlimit.Result, rules []redlimit.Rule) metadata.MD {
	md := metadata.MD{
		HeaderRemaining: {strconv.Itoa(res.Remaining)},
		HeaderReset:     {seconds(ratelimitfields.ResetAfter(res))},
	}
	list, deciding := in.policies.Policies(res, rules)
	if v := ratelimitfields.Format(list); v != "" {
		md[HeaderPolicy] = []string{v}
	}
	if q, ok := ratelimitfields.DecidingQuota(list, deciding); ok {
		md[HeaderLimit] = []string{strconv.FormatInt(q, 10)}
	}
	if !res.Allowed {
		md[HeaderRetryAfter] = []string{seconds(max(res.RetryAfter, time.Second))}
	}
	return md
}

// seconds formats d in whole seconds, rounded up.
func seconds(d time.Duration) string {
	s := (d + time.Second - 1) / time.Second
	return strconv.FormatInt(int64(max(s, 0)), 10)
}

// sleep waits for d or until ctx is done, and then returns ctx.Err().
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
