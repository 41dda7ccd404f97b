package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// defaultTimeout is the read, write and pool timeout that a rate limiter
// wants: a decision that takes longer than 100ms is better treated as a
// failure than waited for.
const defaultTimeout = 100 * time.Millisecond

// newClient returns a client for addr with the settings a rate limiter
// wants: short timeouts (see defaultTimeout; dialing gets 2.5 times as
// long) and no retry of a failed command (the caller decides).
func newClient(addr string, poolSize int, timeout time.Duration) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  addr,
		DialTimeout:           dialTimeout(timeout),
		ReadTimeout:           timeout,
		WriteTimeout:          timeout,
		PoolTimeout:           timeout,
		PoolSize:              poolSize,
		MaxRetries:            -1,
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
	})
}

// dialTimeout returns 2.5 × timeout, or the longest Duration if that
// overflows: a negative dial timeout fails every dial at once.
func dialTimeout(timeout time.Duration) time.Duration {
	if timeout > math.MaxInt64/5 {
		return math.MaxInt64
	}
	return timeout * 5 / 2
}

// newPipeClient returns a client that talks to m over in-memory pipes,
// without a network port.
func newPipeClient(m *miniredis.Miniredis) *redis.Client {
	return redis.NewClient(&redis.Options{
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			return m.Dial()
		},
		MaxRetries:      -1,
		DisableIdentity: true,
	})
}

// ping checks that Redis at rdb answers, so that a wrong address fails with
// one clear error before any work starts.
func ping(ctx context.Context, rdb *redis.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("cannot reach Redis at %s: %w", rdb.Options().Addr, err)
	}
	return nil
}

// newLimiter returns a limiter that reports every Redis failure as an error
// instead of deciding locally: a tool that measures or inspects Redis must
// not quietly answer without it.
func newLimiter(rdb redis.UniversalClient, s redlimit.Strategy, limit redlimit.Limit, opts ...redlimit.Option) (*redlimit.RateLimiter, error) {
	opts = append([]redlimit.Option{redlimit.WithFallback(redlimit.FallbackError)}, opts...)
	l, err := redlimit.New(rdb, s, limit, opts...)
	if err != nil {
		return nil, err
	}
	rl, ok := l.(*redlimit.RateLimiter)
	if !ok {
		return nil, fmt.Errorf("redlimit.New returned a %T, want a *redlimit.RateLimiter", l)
	}
	return rl, nil
}

// checkLimit checks limit and opts by the library's own rules, without
// connecting anywhere (see checkWith).
func checkLimit(s redlimit.Strategy, limit redlimit.Limit, opts ...redlimit.Option) error {
	return checkWith(func(rdb redis.UniversalClient) (*redlimit.RateLimiter, error) {
		return newLimiter(rdb, s, limit, opts...)
	})
}

// checkWith checks what open makes of its options by the library's own
// rules, without connecting anywhere: the client it gives open is never
// used, and what open returns is closed.
func checkWith[L io.Closer](open func(redis.UniversalClient) (L, error)) error {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"})
	defer rdb.Close()
	lim, err := open(rdb)
	if err != nil {
		return err
	}
	return lim.Close()
}

// strategyCodes are the codes of the strategies in their Redis key names.
var strategyCodes = map[redlimit.Strategy]string{
	redlimit.FixedWindow:      "fw",
	redlimit.SlidingLog:       "sl",
	redlimit.SlidingCounter:   "sc",
	redlimit.TokenBucket:      "tb",
	redlimit.LeakyBucket:      "lb",
	redlimit.SubWindowCounter: "sw",
}

// The suffixes of the Redis keys beside a key's state: its penalty block
// (WithBlock) and its pending reservations (Reserve, and prefetches); a
// single-strategy limiter's reservations are those of its one rule.
const (
	blockSuffix   = ":b"
	reserveSuffix = ":r"
)

// stateKey returns the Redis key in which a limiter of strategy s, limit l
// (its Period, and a sub-window counter's SubWindows) and prefix keeps the
// state of key, as the package names it: "<prefix>:{<tag>}:<code><period
// in µs>", and for a sub-window counter "x<sub-windows>" after it, with tag
// as tagKey gives it. For example "redlimit:{user1}:tb1000000" or
// "redlimit:{user1}:sw3600000000x60".
func stateKey(prefix string, s redlimit.Strategy, l redlimit.Limit, key string) string {
	k := prefix + ":{" + tagKey(key) + "}:" + strategyCodes[s] +
		strconv.FormatInt(int64(l.Period/time.Microsecond), 10)
	if s == redlimit.SubWindowCounter {
		k += "x" + strconv.Itoa(subWindowsOf(l))
	}
	return k
}

// subWindowsOf returns a sub-window counter's sub-windows in l: its
// SubWindows, or what 0 means (60, or one per whole millisecond of a
// Period under 60 ms), as the package fills it in.
func subWindowsOf(l redlimit.Limit) int {
	if l.SubWindows != 0 {
		return l.SubWindows
	}
	return int(min(60, l.Period/time.Millisecond))
}

// warmCodes are the codes of the warming buckets (a Limit with a WarmUp)
// in their Redis key names.
var warmCodes = map[redlimit.Strategy]string{
	redlimit.TokenBucket: "wt",
	redlimit.LeakyBucket: "wl",
}

// limitStateKey returns the Redis key in which a limiter of strategy s and
// limit l keeps the state of key: stateKey's, but a calendar limit's names
// the calendar (see calendarCode), and a warming bucket's has the code wt
// or wl ("redlimit:{user1}:wt1000000").
func limitStateKey(prefix string, s redlimit.Strategy, l redlimit.Limit, key string) string {
	if code, ok := calendarCode(l); ok {
		return prefix + ":{" + tagKey(key) + "}:" + code
	}
	if code, ok := warmCodes[s]; ok && l.WarmUp != 0 {
		return prefix + ":{" + tagKey(key) + "}:" + code + strconv.FormatInt(int64(l.Period/time.Microsecond), 10)
	}
	return stateKey(prefix, s, l, key)
}

// limitStateKeys returns stateKeys for a limiter of strategy s and limit l,
// which may be a calendar limit or have a warm-up (see limitStateKey).
func limitStateKeys(prefix string, s redlimit.Strategy, l redlimit.Limit, key string) []string {
	state := limitStateKey(prefix, s, l, key)
	return []string{state, state + blockSuffix, state + reserveSuffix}
}

// stateKeys returns the Redis keys that hold key's state for a limiter of
// strategy s, limit l and prefix, the ones its Reset deletes: the state,
// the penalty block and the pending reservations.
func stateKeys(prefix string, s redlimit.Strategy, l redlimit.Limit, key string) []string {
	state := stateKey(prefix, s, l, key)
	return []string{state, state + blockSuffix, state + reserveSuffix}
}

// keyEscaper percent-encodes the bytes that would end or open a hash tag,
// and '%' itself.
var keyEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// tagKey returns key as the package writes it inside the hash tag (its
// unexported escapeKey, which this must follow): a key longer than
// redlimit.MaxKeyLen bytes, measured before any escaping, becomes "%h" and
// the hex SHA-256 of the key; a shorter one keeps its bytes, with '%', '{'
// and '}' written %25, %7B and %7D (so it may grow past MaxKeyLen). The
// tests check this against the keys the library writes.
func tagKey(key string) string {
	if len(key) > redlimit.MaxKeyLen {
		sum := sha256.Sum256([]byte(key))
		return "%h" + hex.EncodeToString(sum[:])
	}
	return keyEscaper.Replace(key)
}

// strategyValue is a flag.Value holding a strategy name.
type strategyValue struct {
	s   redlimit.Strategy
	all bool // "all" was given (and allowed)
	// allowAll makes "all" a valid value.
	allowAll bool
}

func (v *strategyValue) String() string {
	if v == nil {
		return ""
	}
	if v.all {
		return "all"
	}
	if v.s == 0 {
		return ""
	}
	return v.s.String()
}

func (v *strategyValue) Set(s string) error {
	if s == "all" && v.allowAll {
		v.s, v.all = 0, true
		return nil
	}
	st, err := redlimit.ParseStrategy(s)
	if err != nil {
		return fmt.Errorf("unknown strategy %q (want %s)", s, strategyList(v.allowAll))
	}
	v.s, v.all = st, false
	return nil
}

// strategies returns the strategies the value selects.
func (v *strategyValue) strategies() []redlimit.Strategy {
	if v.all {
		return redlimit.Strategies()
	}
	return []redlimit.Strategy{v.s}
}

// strategyList returns the strategy names, for messages.
func strategyList(withAll bool) string {
	var names []string
	if withAll {
		names = append(names, "all")
	}
	for _, s := range redlimit.Strategies() {
		names = append(names, s.String())
	}
	return strings.Join(names, ", ")
}
