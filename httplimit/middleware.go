// Package httplimit rate-limits net/http handlers with a [redlimit.Limiter].
//
// [Middleware] wraps a handler: for every request it finds a key (by default
// the client's IP address, see [IPKey]), asks the limiter for one event of
// that key, and either calls the next handler or answers 429 Too Many
// Requests. It works with any router that takes func(http.Handler)
// http.Handler middleware: http.ServeMux, chi, gorilla/mux, and echo through
// echo.WrapMiddleware.
//
//	lim, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(10))
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer lim.Close()
//	limit := httplimit.Middleware(lim) // key: the client address, RemoteAddr
//	http.ListenAndServe(":8080", limit(mux))
//
// # Client address behind proxies
//
// By default the key is the peer's address, Request.RemoteAddr, and no
// header is trusted: any client can write X-Forwarded-For. Behind reverse
// proxies, every request has a proxy's address, so tell [IPKey] which one
// header the proxies set, and the networks they connect from; the header is
// then read from those peers only, and nothing else is ever read. When the
// header is missing or unusable (garbage, a list where one address is
// expected, fewer entries than proxies), the key is the peer's address,
// which no client can choose. Pick the line that matches the deployment:
//
//	// No proxy: clients connect to the server itself (the default).
//	httplimit.IPKey()
//
//	// nginx on the same host, with proxy_set_header X-Real-IP $remote_addr;
//	// (it overwrites what the client sent; X-Forwarded-For is not read).
//	httplimit.IPKey(
//		httplimit.WithTrustedProxies(netip.MustParsePrefix("127.0.0.1/32")),
//		httplimit.WithRealIPHeader("X-Real-IP"))
//
//	// nginx on 10.0.1.0/24 appending to X-Forwarded-For, with
//	// proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
//	// (the client's own entries come first and are never read).
//	httplimit.IPKey(
//		httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.1.0/24")),
//		httplimit.WithXForwardedFor(1))
//
//	// A cloud load balancer that appends one entry, such as AWS ALB (the
//	// default "append" mode), its nodes in the VPC 10.0.0.0/16.
//	httplimit.IPKey(
//		httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/16")),
//		httplimit.WithXForwardedFor(1))
//
//	// Google Cloud's external Application Load Balancer appends two: the
//	// client, then the forwarding rule's address. Its proxies connect from
//	// 35.191.0.0/16 and 130.211.0.0/22.
//	httplimit.IPKey(
//		httplimit.WithTrustedProxies(
//			netip.MustParsePrefix("35.191.0.0/16"),
//			netip.MustParsePrefix("130.211.0.0/22")),
//		httplimit.WithXForwardedFor(2))
//
// Pass the result to [WithKeyFunc]. The hops of WithXForwardedFor count the
// entries that the proxies append, usually one each (a CDN in front of the
// load balancer adds one more), and every request must go through all of
// them. Use WithRealIPHeader for CF-Connecting-IP or True-Client-IP when
// the proxy sets it, and [WithForwarded] for the Forwarded field of RFC
// 7239.
//
// # Response headers
//
// Every response that the limiter decided, allowed or denied, carries the
// fields of the IETF draft draft-ietf-httpapi-ratelimit-headers (-09 to
// -11), written as Structured Fields. For a token bucket of 10 per second
// with a Burst of 20, after one request:
//
//	RateLimit-Policy: "token-bucket";q=20;w=2
//	RateLimit: "token-bucket";r=19;t=1
//
// RateLimit-Policy is a list of quota policies, each a name with q events
// per window of w seconds: the limit at its steady rate, with q at least
// the most that r can show (Rate for the windows, Burst for the buckets),
// and w in whole seconds even for periods under a second (10 per 100ms is
// q=100;w=1); see [Quota] for each strategy and the rounding. RateLimit
// names the policy that decided, with r the events remaining now and t the
// seconds until that policy (a Policy's deciding rule: its
// Result.RuleResetAfter) is back at its full allowance (rounded up).
//
// A single-strategy limiter of this module has one policy, named after its
// strategy ("fixed-window", "sliding-log", "sliding-counter",
// "token-bucket", "leaky-bucket", "sub-window-counter"), or as
// [WithPolicyName] says; a Limiter
// that does not report its strategy has one named [DefaultPolicyName]. A
// [redlimit.Policy] has one policy per rule, in the order of its rules,
// each named after the rule (Rule.Name, or its default name such as
// "token-bucket-1s"; bytes that are not printable ASCII become '_', and
// a name that is then another's gets "-2", "-3"...), and
// RateLimit names the rule that decided (Result.Rule); WithPolicyName does
// not rename them. Every policy is a limit the request was decided by:
// with [redlimit.WithLimitFunc], the limit it gave for the request's key,
// and with [redlimit.WithRulesFunc], every rule it gave (a paid plan's
// rules for a paid caller), not the limiter's own.
//
// [WithXRateLimitHeaders] adds the older X-RateLimit-Limit (q of the policy
// that decided), X-RateLimit-Remaining and X-RateLimit-Reset fields. A
// denied request also gets Retry-After, in whole seconds rounded up and at
// least 1.
//
// Responses to requests that were not decided (the key could not be found,
// or the limiter failed) carry none of these fields.
//
// # Outcomes and defaults
//
//   - Allowed: the next handler is called. The [redlimit.Result] is in the
//     request's context; read it with [ResultFromContext].
//   - Denied: 429 Too Many Requests, plain text "Too Many Requests"; see
//     [WithDeniedHandler].
//   - Key not found: 400 Bad Request when the error wraps [ErrNoKey] (the
//     request lacks what identifies its client, such as an API key header),
//     500 Internal Server Error for any other error (a key function that
//     fails on a well-formed request is a server misconfiguration); see
//     [WithKeyErrorHandler].
//   - Limiter error: 503 Service Unavailable, never 429, since a broken
//     limiter did not deny anything; see [WithErrorHandler]. A limiter that
//     answers from its fallback while Redis is down (Result.Degraded) is not
//     an error: those results are served like any other.
//   - Cost above capacity ([WithCost]: more events than a rule can ever
//     hold at once, an error wrapping [redlimit.ErrExceedsLimit]): 413
//     Request Entity Too Large (RFC 9110's Content Too Large), with the
//     plain-text body "Request Entity Too Large: the request costs more than
//     the rate limit allows at once". Waiting never admits it, so it is the
//     client's error, not a 429 or a 503. The limiter's observer sees it
//     (see [redlimit.WithObserver]).
//   - Leaky bucket (Result.Delay > 0): the middleware waits Delay before it
//     calls the next handler, at most 1s by default ([WithMaxDelay]).
//
// Shadowed results (redlimit.WithShadow) are allowed, and their headers are
// written as the limiter reported them.
//
// # Costs and concurrency
//
// [WithCost] reserves a request's estimated cost (an LLM call's maximum
// tokens) before the handler and settles what the handler passed to
// [Report] when it returns. [SetHeaders] writes the fields of a Result
// that a handler decided itself. [ConcurrencyMiddleware] holds a lease of
// a [redlimit.Concurrency] while the handler runs.
package httplimit

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/calldelay"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// Names of the header fields the middleware writes.
const (
	// HeaderRateLimitPolicy is the IETF draft field describing the quota
	// policies: `"<name>";q=<quota>;w=<window seconds>`, see [Quota].
	HeaderRateLimitPolicy = "RateLimit-Policy"
	// HeaderRateLimit is the IETF draft field describing the current state
	// of the policy that decided:
	// `"<name>";r=<remaining>;t=<seconds until reset>`.
	HeaderRateLimit = "RateLimit"
	// HeaderRetryAfter is written on denied requests: whole seconds, rounded
	// up, at least 1.
	HeaderRetryAfter = "Retry-After"
	// HeaderXRateLimitLimit is the legacy field with the quota q of the
	// policy that decided (see [Quota]), which X-RateLimit-Remaining never
	// exceeds; see [WithXRateLimitHeaders].
	HeaderXRateLimitLimit = "X-RateLimit-Limit"
	// HeaderXRateLimitRemaining is the legacy field with the events
	// remaining now; see [WithXRateLimitHeaders].
	HeaderXRateLimitRemaining = "X-RateLimit-Remaining"
	// HeaderXRateLimitReset is the legacy field with the seconds (a delta,
	// not a Unix time) until the policy that decided is back at its full
	// allowance, rounded up, as the RateLimit field's t; see
	// [WithXRateLimitHeaders].
	HeaderXRateLimitReset = "X-RateLimit-Reset"
)

// DefaultPolicyName is the name of the policy in the RateLimit and
// RateLimit-Policy fields for a Limiter that does not report its strategy
// (with a Strategy() redlimit.Strategy method, as redlimit's single-strategy
// limiters do) nor its rules (as a redlimit.Policy does), unless
// [WithPolicyName] sets another.
const DefaultPolicyName = "default"

// DefaultMaxDelay is the longest the middleware waits for a leaky bucket's
// Result.Delay unless [WithMaxDelay] sets another bound.
const DefaultMaxDelay = time.Second

// Option configures [Middleware]. Options are applied in order, so a later
// one wins.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config holds every option, with its default set in defaultConfig.
type config struct {
	key        KeyFunc
	denied     http.Handler
	keyError   func(http.ResponseWriter, *http.Request, error)
	err        func(http.ResponseWriter, *http.Request, error)
	maxDelay   time.Duration
	policy     string
	named      bool // policy set by WithPolicyName
	xRateLimit bool
	cost       costConfig    // WithCost, WithOnSettleError: see cost.go
	retryHint  time.Duration // WithRetryAfterHint: see concurrency.go
	priority   func(*http.Request) redlimit.Priority
}

func defaultConfig() config {
	return config{
		key:        IPKey(),
		denied:     http.HandlerFunc(defaultDenied),
		keyError:   defaultKeyError,
		err:        defaultError,
		maxDelay:   DefaultMaxDelay,
		policy:     "", // the strategy's name, or DefaultPolicyName; a Policy's rules' names
		xRateLimit: false,
		retryHint:  DefaultRetryAfterHint,
	}
}

// WithKeyFunc sets the function that finds a request's key. The default is
// IPKey(), the client address from RemoteAddr with no header trusted (see
// the package documentation behind proxies). The key
// is passed to the limiter as is: to give routes separate limits with one
// limiter, make f add a prefix per route.
func WithKeyFunc(f KeyFunc) Option {
	return optionFunc(func(c *config) { c.key = f })
}

// WithDeniedHandler sets the handler for denied requests. When it runs, the
// rate-limit fields and Retry-After are already in w.Header(), and the
// result is in r's context ([ResultFromContext]); h writes the status and
// the body. The default writes 429 Too Many Requests with the plain-text
// body "Too Many Requests".
func WithDeniedHandler(h http.Handler) Option {
	return optionFunc(func(c *config) { c.denied = h })
}

// WithKeyErrorHandler sets the function that answers a request whose key
// could not be found: err is the key function's error, or one wrapping
// [ErrNoKey] when it returned an empty key. The default answers 400 Bad
// Request when err wraps ErrNoKey and 500 Internal Server Error otherwise,
// with the status text as a plain-text body (err is not shown to the
// client).
func WithKeyErrorHandler(f func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return optionFunc(func(c *config) { c.keyError = f })
}

// WithErrorHandler sets the function that answers a request when the
// limiter returns an error (such as Redis being down with the FallbackError
// policy, or the request's context ending). The default answers 503 Service
// Unavailable with the status text as a plain-text body (err is not shown
// to the client), and 413 Request Entity Too Large to a request whose cost
// is more than a rule can ever hold (err wraps [redlimit.ErrExceedsLimit],
// see [WithCost]).
func WithErrorHandler(f func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return optionFunc(func(c *config) { c.err = f })
}

// WithMaxDelay bounds how long the middleware waits for a leaky bucket's
// Result.Delay before it calls the next handler. The wait also ends when
// the request's context does; the middleware then returns without writing
// anything, since the client is gone or a timeout handler answers.
//
// A request whose Delay would be longer than d is answered as denied (429
// by default), and takes no slot in the queue: the middleware tells a
// limiter of this module the longest it will wait, as WaitN does for its
// context's deadline, and Retry-After is when the Delay would be d or less.
// (A Limiter of another kind that gives such a Delay has taken its slot:
// the request is denied with Retry-After the Delay, rounded up.) 0 means
// never wait (every request that would be delayed is denied); a negative d
// removes the bound. The default is [DefaultMaxDelay], 1s,
// shorter than the timeouts of most clients.
func WithMaxDelay(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxDelay = d })
}

// WithPolicyName sets the name of a single-strategy limiter's one policy
// in the RateLimit and RateLimit-Policy fields. It must be printable ASCII
// (it is written as a Structured Field String, with '"' and '\' escaped).
// The default is the limiter's strategy ("token-bucket"), or
// [DefaultPolicyName], "default", for a Limiter that does not report one.
//
// A [redlimit.Policy] has one policy per rule, named after the rules (see
// the package documentation): the name is not used, though it must still
// be printable ASCII. Name the rules (Rule.Name) instead.
func WithPolicyName(name string) Option {
	return optionFunc(func(c *config) { c.policy, c.named = name, true })
}

// WithXRateLimitHeaders turns on (or off) the legacy fields
// X-RateLimit-Limit (the quota q of RateLimit-Policy, see [Quota]),
// X-RateLimit-Remaining and X-RateLimit-Reset
// (seconds until the key is back at its full allowance, rounded up: a
// delta, not a Unix time), written beside the IETF fields. The default is
// off: the IETF fields are the standard being written, and the legacy ones
// only double the header bytes; turn them on for clients that read only
// X-RateLimit-*.
func WithXRateLimitHeaders(on bool) Option {
	return optionFunc(func(c *config) { c.xRateLimit = on })
}

// WithPriority sets the function that gives each request its priority,
// put on the limiter call's context with [redlimit.ContextWithPriority]:
// with [redlimit.WithPriorityShares], Sheddable requests (a bulk export)
// may use only a share of the limit and Critical ones (health checks,
// logins) all of it. The default is none: every request is Normal.
func WithPriority(f func(*http.Request) redlimit.Priority) Option {
	return optionFunc(func(c *config) { c.priority = f })
}

func (c *config) validate() error {
	switch {
	case c.key == nil:
		return errors.New("httplimit: nil key function")
	case c.denied == nil:
		return errors.New("httplimit: nil denied handler")
	case c.keyError == nil:
		return errors.New("httplimit: nil key error handler")
	case c.err == nil:
		return errors.New("httplimit: nil error handler")
	case c.retryHint <= 0:
		return errors.New("httplimit: Retry-After hint " + c.retryHint.String() + " is not positive")
	}
	if !ratelimitfields.IsPrintable(c.policy) {
		return errors.New("httplimit: policy name " + strconv.Quote(c.policy) + " is not printable ASCII")
	}
	return nil
}

// newConfig returns the config of opts, applied in order over the
// defaults. It panics if an option is invalid.
func newConfig(opts []Option) config {
	cfg := defaultConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		panic(err.Error())
	}
	return cfg
}

// requestKey returns the key of r, found by the key function. When there
// is none (an error, or an empty key, which counts as one wrapping
// [ErrNoKey]), it answers r with the key error handler and returns false.
func (c *config) requestKey(w http.ResponseWriter, r *http.Request) (string, bool) {
	key, err := c.key(r)
	if err == nil && key == "" {
		err = errEmptyKey
	}
	if err != nil {
		c.keyError(w, r, err)
		return "", false
	}
	return key, true
}

// Middleware returns a middleware that limits requests with l, taking one
// event per request from the key found by the key function (see the package
// documentation for the outcomes and the header fields). It is safe for
// concurrent use. It panics if l is nil or an option is invalid (a nil
// function or handler, a policy name that is not printable ASCII).
func Middleware(l redlimit.Limiter, opts ...Option) func(http.Handler) http.Handler {
	if l == nil {
		panic("httplimit: nil limiter")
	}
	cfg := newConfig(opts)
	reserver := cfg.cost.reserver(l)
	policies := ratelimitfields.NewSource(l, cfg.policy, cfg.named, DefaultPolicyName)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, ok := cfg.requestKey(w, r)
			if !ok {
				return
			}
			ctx := r.Context()
			callCtx := cfg.callContext(r)
			var (
				res   redlimit.Result
				rules []redlimit.Rule
				resv  *redlimit.Reservation // WithCost: the events reserved
				n     int                   // and how many
				err   error
			)
			if reserver != nil {
				n = cfg.cost.f(r)
				resv, rules, err = policies.Reserve(callCtx, reserver, key, n)
				res = resv.Result()
			} else {
				res, rules, err = policies.Allow(callCtx, l, key)
			}
			if err != nil {
				cfg.err(w, r, err)
				return
			}
			list, deciding := policies.Policies(res, rules)
			writeHeaders(w.Header(), res, list, deciding, cfg.xRateLimit)
			r = r.WithContext(context.WithValue(ctx, resultKey{}, res))
			if !res.Allowed {
				cfg.deny(w, r, res.RetryAfter)
				return
			}
			if res.Delay > 0 && !cfg.awaitDelay(w, r, res.Delay, resv) {
				return
			}
			if resv != nil {
				// Settled when the handler returns, also when it panics.
				var c *costState
				r, c = withCost(r)
				defer cfg.cost.settleReported(r, resv, n, c)
			}
			next.ServeHTTP(w, r)
		})
	}
}

// callContext returns the context of the limiter call for r: r's, with the
// priority that the priority function gives r, and the longest Delay the
// middleware waits for.
func (c *config) callContext(r *http.Request) context.Context {
	ctx := r.Context()
	if c.priority != nil {
		ctx = redlimit.ContextWithPriority(ctx, c.priority(r))
	}
	if c.maxDelay >= 0 {
		// A leaky bucket then refuses, taking nothing, a slot
		// whose Delay is longer than the middleware will wait.
		ctx = calldelay.With(ctx, c.maxDelay)
	}
	return ctx
}

// deny answers r as denied: Retry-After, then the denied handler.
func (c *config) deny(w http.ResponseWriter, r *http.Request, retryAfter time.Duration) {
	setRetryAfter(w.Header(), retryAfter)
	c.denied.ServeHTTP(w, r)
}

// awaitDelay waits for delay, the Delay of r's admitted Result, and
// reports whether to go on to the next handler. When delay is longer than
// the middleware waits (a Limiter not of this module took the slot
// anyway), it answers r as denied instead; when r's context ends first, it
// returns without writing anything. Either way it settles resv (WithCost)
// with nothing used.
func (c *config) awaitDelay(w http.ResponseWriter, r *http.Request, delay time.Duration, resv *redlimit.Reservation) bool {
	if c.maxDelay >= 0 && delay > c.maxDelay {
		c.cost.settle(r, resv, 0)
		c.deny(w, r, delay)
		return false
	}
	t := time.NewTimer(delay)
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		t.Stop()
		c.cost.settle(r, resv, 0)
		return false
	}
}

type resultKey struct{}

// ResultFromContext returns the limiter's result for the request whose
// context is ctx, and whether there is one. The middleware puts it in the
// context it passes to the next handler and to the denied handler.
func ResultFromContext(ctx context.Context) (redlimit.Result, bool) {
	res, ok := ctx.Value(resultKey{}).(redlimit.Result)
	return res, ok
}

// writeHeaders writes the rate-limit fields for res, decided by the policy
// named deciding in list. RateLimit-Policy is left out when no policy has
// a usable Limit, and X-RateLimit-Limit when the deciding one has none.
func writeHeaders(h http.Header, res redlimit.Result, list []ratelimitfields.Policy, deciding string, xRateLimit bool) {
	if v := ratelimitfields.Format(list); v != "" {
		h.Set(HeaderRateLimitPolicy, v)
	}
	h.Set(HeaderRateLimit, formatRateLimit(deciding, res))
	if xRateLimit {
		if q, ok := ratelimitfields.DecidingQuota(list, deciding); ok {
			h.Set(HeaderXRateLimitLimit, strconv.FormatInt(q, 10))
		}
		h.Set(HeaderXRateLimitRemaining, strconv.FormatInt(remaining(res), 10))
		h.Set(HeaderXRateLimitReset, strconv.FormatInt(resetSeconds(res), 10))
	}
}

// setRetryAfter sets Retry-After in h to d in whole seconds, rounded up and
// at least 1.
func setRetryAfter(h http.Header, d time.Duration) {
	h.Set(HeaderRetryAfter, strconv.FormatInt(max(ceilSeconds(d), 1), 10))
}

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

func defaultDenied(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
}

func defaultKeyError(w http.ResponseWriter, _ *http.Request, err error) {
	code := http.StatusInternalServerError
	if errors.Is(err, ErrNoKey) {
		code = http.StatusBadRequest
	}
	http.Error(w, http.StatusText(code), code)
}

func defaultError(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.Is(err, redlimit.ErrExceedsLimit) {
		http.Error(w, http.StatusText(http.StatusRequestEntityTooLarge)+": the request costs more than the rate limit allows at once", http.StatusRequestEntityTooLarge)
		return
	}
	http.Error(w, http.StatusText(http.StatusServiceUnavailable), http.StatusServiceUnavailable)
}
