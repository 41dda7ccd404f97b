package redlimit

import (
	"errors"

	"github.com/redlimit/redlimit/internal/errprefix"
)

// Errors returned by the package. Every error is wrapped with context, so
// compare with [errors.Is]. A message names the package once, at its start:
// "redlimit: settle \"k\": reservation already settled or lapsed".
var (
	// ErrExceedsLimit is returned by AllowN, WaitN and Reserve when n is
	// more than the limit can ever allow at once (more than Rate for the
	// windows, more than Burst for the buckets), and by Reservation.Settle
	// when used is more than the state can owe (see Settle).
	ErrExceedsLimit = errors.New("redlimit: n exceeds the limit")
	// ErrInvalidLimit is returned by the constructors (and for a limit from
	// WithLimitFunc or WithRulesFunc) for a Limit, Rule or Strategy that
	// cannot work (Rate < 1, Period < 1ms, Burst < 0, values too large, an
	// unknown strategy, two rules sharing one state).
	ErrInvalidLimit = errors.New("redlimit: invalid limit")
	// ErrInvalidArgument is returned for an argument that cannot work: an
	// option that is invalid or does not apply to the limiter (by the
	// constructors), a nil client or option, and at call time an empty key,
	// a negative n, a nil Context, a Reservation or Lease that Reserve or
	// Acquire did not return.
	ErrInvalidArgument = errors.New("redlimit: invalid argument")
	// ErrClosed is returned by every call made after Close.
	ErrClosed = errors.New("redlimit: limiter closed")
	// ErrUnavailable is wrapped by the errors returned while Redis is down and
	// the fallback policy is FallbackError.
	ErrUnavailable = errors.New("redlimit: redis unavailable")
	// ErrSettled is returned by Settle and Cancel for a reservation that is
	// settled already (by an earlier call, also one whose reply was lost), that
	// lapsed (it was not settled within the reservation lifetime, see
	// [WithReservationTTL], and stands as taken), or that a Reset of every
	// rule's state forgot. Nothing changes.
	ErrSettled = errors.New("redlimit: reservation already settled or lapsed")
	// ErrLeaseExpired is returned by [Lease.Extend] for a lease that is no
	// longer held: its ttl ended before the call (another holder may have its
	// slot by now), or it was released.
	ErrLeaseExpired = errors.New("redlimit: lease expired")
	// ErrEvictionPolicy reports a Redis server that may evict limiter keys: it
	// has a memory limit (maxmemory) and a maxmemory-policy other than
	// noeviction. An evicted key comes back with a full allowance, so such a
	// server admits more than the limits once it is full. See [CheckRedis] and
	// the README's section on Redis memory.
	ErrEvictionPolicy = errors.New("redlimit: Redis may evict limiter keys")
)

// errorf returns an error with the message "redlimit: " and format, for
// every error the package makes around a sentinel or a cause; a wrapped
// error's own "redlimit: " is left out of the message (errors.Is and
// errors.As still see it), so that the package is named once.
func errorf(format string, args ...any) error {
	return errprefix.Errorf("redlimit: ", format, args...)
}
