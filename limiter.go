package redlimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limit is a rate: Rate events per Period. The zero value is not a valid
// Limit; use [PerSecond], [PerMinute], [PerHour] or fill in the fields.
type Limit struct {
	Rate   int           // events allowed per Period
	Period time.Duration // window length, or the time in which Rate tokens refill
	Burst  int           // bucket capacity for TokenBucket and LeakyBucket; 0 means Rate
}

// PerSecond returns a Limit of rate events per second.
func PerSecond(rate int) Limit { return Limit{Rate: rate, Period: time.Second} }

// PerMinute returns a Limit of rate events per minute.
func PerMinute(rate int) Limit { return Limit{Rate: rate, Period: time.Minute} }

// PerHour returns a Limit of rate events per hour.
func PerHour(rate int) Limit { return Limit{Rate: rate, Period: time.Hour} }

// String returns the limit as "rate/period", with the burst when it is set,
// for example "10/1s" or "10/1s burst 20".
func (l Limit) String() string {
	s := strconv.Itoa(l.Rate) + "/" + l.Period.String()
	if l.Burst != 0 && l.Burst != l.Rate {
		s += " burst " + strconv.Itoa(l.Burst)
	}
	return s
}

// Limits on the values a Limit may hold: a Limit outside them is an error
// wrapping ErrInvalidLimit. They keep every number the scripts compute
// exact, or at worst rounded, in a Lua double.
const (
	// MaxRate is the largest Rate (and Burst) accepted: 2^40, about 1.1e12.
	MaxRate = 1 << 40
	// MaxPeriod is the largest Period accepted: 100 years.
	MaxPeriod = 100 * 365 * 24 * time.Hour
	// MinPeriod is the smallest Period accepted.
	MinPeriod = time.Millisecond
)

// Result is the answer to one decision. For example, for a token bucket of
// PerSecond(10) that is empty, AllowN(ctx, key, 1) returns Allowed false,
// Remaining 0, RetryAfter 100ms and ResetAfter 1s.
type Result struct {
	Allowed    bool          // the n events may happen (LeakyBucket: after Delay)
	Limit      Limit         // the limit that decided, with Burst filled in
	Remaining  int           // events that could still be allowed right now, >= 0
	RetryAfter time.Duration // when denied: how long until the same n can be allowed; 0 when allowed
	ResetAfter time.Duration // how long until the key is back at its full allowance, with no more traffic
	Delay      time.Duration // LeakyBucket: wait this long before acting, to keep the leak rate; else 0
	Degraded   bool          // decided without Redis (see FallbackPolicy); false otherwise
	Shadowed   bool          // shadow mode (WithShadow): the limit would have denied, but Allowed is true
	Rule       string        // Policy: the deciding rule's name (see Policy); empty for a RateLimiter
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

// Strategy names a rate-limiting algorithm. See the package documentation
// for how to choose one.
type Strategy int

// The strategies.
const (
	FixedWindow Strategy = iota + 1
	SlidingLog
	SlidingCounter
	TokenBucket
	LeakyBucket
)

var strategyNames = [...]string{
	FixedWindow:    "fixed-window",
	SlidingLog:     "sliding-log",
	SlidingCounter: "sliding-counter",
	TokenBucket:    "token-bucket",
	LeakyBucket:    "leaky-bucket",
}

// Strategies lists every strategy, in the order of their values.
func Strategies() []Strategy {
	return []Strategy{FixedWindow, SlidingLog, SlidingCounter, TokenBucket, LeakyBucket}
}

// String returns the strategy's name: "fixed-window", "sliding-log",
// "sliding-counter", "token-bucket" or "leaky-bucket".
func (s Strategy) String() string {
	if s >= FixedWindow && s <= LeakyBucket {
		return strategyNames[s]
	}
	return "Strategy(" + strconv.Itoa(int(s)) + ")"
}

// ParseStrategy returns the strategy named s, as written by String.
func ParseStrategy(s string) (Strategy, error) {
	for _, st := range Strategies() {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, errorf("unknown strategy %q (want one of fixed-window, sliding-log, sliding-counter, token-bucket, leaky-bucket)", s)
}

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
	}
	return nil, errorf("unknown strategy %v: %w", s, ErrInvalidLimit)
}

// validate checks a limit against the rules every strategy shares and
// returns it with Burst filled in.
func (l Limit) validate(maxRate int) (Limit, error) {
	bad := func(format string, args ...any) (Limit, error) {
		return l, errorf("limit %v: %s: %w", l, fmt.Sprintf(format, args...), ErrInvalidLimit)
	}
	switch {
	case l.Rate < 1:
		return bad("Rate must be at least 1")
	case l.Rate > maxRate:
		return bad("Rate must be at most %d", maxRate)
	case l.Period < MinPeriod:
		return bad("Period must be at least %v", MinPeriod)
	case l.Period > MaxPeriod:
		return bad("Period must be at most %v", MaxPeriod)
	case l.Period%time.Microsecond != 0:
		return bad("Period must be a whole number of microseconds")
	case l.Burst < 0:
		return bad("Burst must not be negative")
	case l.Burst > MaxRate:
		return bad("Burst must be at most %d", MaxRate)
	}
	if l.Burst == 0 {
		l.Burst = l.Rate
	}
	return l, nil
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

// MaxKeyLen is the longest key kept as it is in Redis key names. A longer
// key is replaced by "%h" and the hex SHA-256 of the key (66 bytes), still
// inside the hash tag, so that one key is one cluster slot and a huge key
// (an attacker's header, say) costs neither Redis memory nor time on every
// call. "%h" cannot come out of escaping, so a hashed key never meets a
// short one. It is not a bound on keys (any non-empty key is valid) but
// part of the key layout (see [WithPrefix]) that tools reading Redis
// rebuild, as cmd/redlimit's inspect does.
const MaxKeyLen = 256

// escapeKey makes a user key safe to put inside a hash tag: '%', '{' and '}'
// are percent-encoded, so the tag ends at the first '}' and two different
// keys never give the same Redis key; keys longer than MaxKeyLen are hashed.
func escapeKey(key string) string {
	if len(key) > MaxKeyLen {
		sum := sha256.Sum256([]byte(key))
		return "%h" + hex.EncodeToString(sum[:])
	}
	if !strings.ContainsAny(key, "%{}") {
		return key
	}
	var b strings.Builder
	b.Grow(len(key) + 8)
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
