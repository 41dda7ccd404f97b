package redlimit

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Result is the answer to one decision. For example, for a token bucket of
// PerSecond(10) that is empty, AllowN(ctx, key, 1) returns Allowed false,
// Remaining 0, RetryAfter 100ms and ResetAfter 1s.
type Result struct {
	Allowed    bool          // the n events may happen (LeakyBucket: after Delay)
	Limit      Limit         // the limit that decided, with Burst (and SubWindows) filled in
	Remaining  int           // events that could still be allowed right now, >= 0
	RetryAfter time.Duration // when denied: how long until the same n can be allowed; 0 when allowed
	ResetAfter time.Duration // how long until the key is back at its full allowance, with no more traffic
	Delay      time.Duration // LeakyBucket: wait this long before acting, to keep the leak rate; else 0
	Degraded   bool          // decided without Redis (see FallbackPolicy); false otherwise
	Shadowed   bool          // shadow mode (WithShadow): the limit would have denied, but Allowed is true
	Stale      bool          // WithRegions: decided while a peer region was silent past the staleness bound (docs/regions.md)
	ByPriority bool          // denied (or, Shadowed, would have been) by the call's priority share alone (WithPriorityShares): the limit itself would have admitted it
	Rule       string        // Policy: the deciding rule's name (see Policy); empty for a RateLimiter
	// RuleResetAfter is ResetAfter of the deciding rule alone (the one Rule
	// and Limit name): how long until that rule is back at its full
	// allowance, with no more traffic, and a penalty block has ended. A
	// Policy of a per-second and a per-hour rule, denied by the first: 1s,
	// where ResetAfter waits for the hour. With one rule (a RateLimiter),
	// and while a penalty block decides, it is ResetAfter.
	RuleResetAfter time.Duration
}

// Limiter decides, per key, whether events may happen. All implementations
// in this package are safe for concurrent use.
type Limiter interface {
	// Allow is shorthand for AllowN(ctx, key, 1).
	Allow(ctx context.Context, key string) (Result, error)
	// AllowN reports whether n events may happen now for key, and consumes
	// them if so. A denial is not an error: err is non-nil only when no
	// decision could be made (bad arguments, Redis failing with the
	// FallbackError policy, ctx done). n = 0 consumes nothing and reports
	// the current state.
	AllowN(ctx context.Context, key string, n int) (Result, error)
	// Wait is shorthand for WaitN(ctx, key, 1).
	Wait(ctx context.Context, key string) error
	// WaitN blocks until n events may happen for key, consumes them and
	// returns nil; or returns an error wrapping context.DeadlineExceeded at
	// once when the wait needed is longer than ctx allows.
	WaitN(ctx context.Context, key string, n int) error
	// Reset forgets all state of key (in Redis and in this process).
	Reset(ctx context.Context, key string) error
	// Close stops the limiter's fallback monitor and makes later calls
	// return ErrClosed. It does not close the Redis client.
	Close() error
}

// Both limiter types have the Limiter methods, from the engine they embed.
var (
	_ Limiter = (*RateLimiter)(nil)
	_ Limiter = (*Policy)(nil)
)

// New returns a limiter of strategy s. It is the same as calling the
// strategy's own constructor, such as [NewTokenBucket].
func New(rdb redis.UniversalClient, s Strategy, limit Limit, opts ...Option) (Limiter, error) {
	switch s {
	case FixedWindow:
		return NewFixedWindow(rdb, limit, opts...)
	case SlidingLog:
		return NewSlidingLog(rdb, limit, opts...)
	case SlidingCounter:
		return NewSlidingCounter(rdb, limit, opts...)
	case TokenBucket:
		return NewTokenBucket(rdb, limit, opts...)
	case LeakyBucket:
		return NewLeakyBucket(rdb, limit, opts...)
	case SubWindowCounter:
		return NewSubWindowCounter(rdb, limit, opts...)
	}
	return nil, errorf("unknown strategy %v: %w", s, ErrInvalidLimit)
}

// checkKey rejects keys that cannot be limited.
func checkKey(key string) error {
	if key == "" {
		return errorf("empty key: %w", ErrInvalidArgument)
	}
	return nil
}

// checkContext rejects a nil Context (a caller's bug, which would panic
// deep inside the client), as net/http's NewRequestWithContext does.
func checkContext(ctx context.Context) error {
	if ctx == nil {
		return errorf("nil Context: %w", ErrInvalidArgument)
	}
	return nil
}
