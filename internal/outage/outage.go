// Package outage tells, from an error of a go-redis v9 call, whether Redis
// could not answer (an outage of the call or of the whole node), as opposed
// to an answer or a bug. It knows go-redis's unexported error texts and the
// replies with which a server refuses work for a state of the node.
package outage

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Kind says what an error means for the node that gave it.
type Kind int8

// The kinds, from the least to the most that an error says of its node.
const (
	None Kind = iota // an answer, a bug, or the caller's own business
	Call             // may concern this call only: probe the node before marking it down
	Node             // the node cannot answer now: mark it down
)

// Texts of go-redis v9 errors that are not exported.
const (
	errRingDown      = "redis: all ring shards are down"
	errNoNodes       = "redis: cluster has no nodes"
	errNoSentinel    = "redis: all sentinels specified in configuration are unreachable"
	errConnUnusable  = "redis: timed out trying to mark connection as unusable"
	errFDReaderGone  = "redis: autopipeline full-duplex reader exited"
	errFDConnMoving  = "redis: autopipeline: full-duplex connection moving"
	errFDMaxHold     = "redis: autopipeline: full-duplex connection max-hold reached"
	errFDBudgetSpent = "redis: autopipeline: retry budget exhausted before shutdown flush"
)

// refusedInScript are the replies with which a server refuses a script's
// write for a state of the node (memory, disk, role, replicas).
var refusedInScript = [...]string{": -OOM ", ": -MISCONF ", ": -READONLY ", ": -NOREPLICAS ", ": -MASTERDOWN "}

// scriptRefused tells whether err is a script's error wrapping such a
// refusal. Redis 6 runs a script and refuses its first write, wrapping the
// reason: "ERR Error running script (call to f_...): @user_script:269:
// @user_script: 269: -OOM command not allowed ..." (OOM and MISCONF seen
// on 6.0.16); Redis 7 refuses the script itself with the plain reply.
func scriptRefused(err error) bool {
	if !redis.HasErrorPrefix(err, "Error running script") {
		return false
	}
	msg := err.Error()
	for _, r := range refusedInScript {
		if strings.Contains(msg, r) {
			return true
		}
	}
	return false
}

// Classify tells whether err says that Redis cannot answer now, as opposed
// to an answer or a bug, and whether it concerns the whole node.
func Classify(err error) Kind {
	if err == nil {
		return None
	}
	var (
		opErr  *net.OpError
		netErr net.Error
		reply  redis.Error
	)
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial", errors.Is(err, syscall.ECONNREFUSED):
		return Node
	case errors.As(err, &reply):
		_, moved := redis.IsMovedError(err)
		_, ask := redis.IsAskError(err)
		switch {
		case redis.IsTryAgainError(err), moved, ask:
			// One call during a slot migration (go-redis follows MOVED and
			// ASK, up to MaxRedirects times).
			return Call
		case redis.IsLoadingError(err), redis.IsReadOnlyError(err),
			redis.IsClusterDownError(err), redis.IsMasterDownError(err),
			redis.IsOOMError(err), redis.IsMaxClientsError(err),
			redis.HasErrorPrefix(err, "BUSY "), redis.HasErrorPrefix(err, "NOREPLICAS"),
			redis.HasErrorPrefix(err, "MISCONF"),
			scriptRefused(err):
			return Node
		}
		return None
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, errRingDown), strings.Contains(msg, errNoNodes),
		strings.Contains(msg, errNoSentinel):
		return Node
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.ErrClosedPipe),
		errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrPoolExhausted), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, redis.ErrAutoPipelineTimeout), errors.Is(err, redis.ErrAutoPipelineQueueFull),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		strings.Contains(msg, errConnUnusable), strings.Contains(msg, errFDReaderGone),
		strings.Contains(msg, errFDConnMoving), strings.Contains(msg, errFDMaxHold),
		strings.Contains(msg, errFDBudgetSpent), errors.As(err, &netErr):
		return Call
	}
	return None
}

// Is reports whether err says that Redis cannot answer now, as opposed to
// an answer or a bug.
func Is(err error) bool { return Classify(err) != None }

// Unreachable reports whether a probe's err says that the node could not be
// reached at all, rather than that it answered with an error or hung.
func Unreachable(err error) bool {
	var opErr *net.OpError
	var reply redis.Error
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial", errors.Is(err, syscall.ECONNREFUSED):
		return true
	case errors.As(err, &reply):
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, errRingDown) || strings.Contains(msg, errNoNodes) ||
		strings.Contains(msg, errNoSentinel)
}
