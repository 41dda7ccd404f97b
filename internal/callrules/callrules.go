// Package callrules lets the middleware of this module learn the rules that
// decided one call of a limiter whose rules are given per call
// (redlimit.WithRulesFunc): the middleware puts a Sink in the call's
// context, and the limiter puts the call's rules in it. Only packages
// under github.com/redlimit/redlimit can import it; it is no part of the
// API.
//
// It is generic so that it need not import redlimit, which imports it:
// redlimit puts []redlimit.Rule, and the middleware asks for the Sink of
// that type.
package callrules

import (
	"context"
	"sync/atomic"
)

// key is the context key of the Sink of rules of type T.
type key[T any] struct{}

// Sink receives the rules of one call. It is safe for concurrent use.
type Sink[T any] struct {
	rules atomic.Pointer[[]T]
}

// New returns a context derived from ctx that carries a new, empty Sink,
// and the Sink.
func New[T any](ctx context.Context) (context.Context, *Sink[T]) {
	s := new(Sink[T])
	return context.WithValue(ctx, key[T]{}, s), s
}

// From returns the Sink that ctx carries, or nil: a limiter calls it to
// learn whether anyone wants the rules before it makes them.
func From[T any](ctx context.Context) *Sink[T] {
	s, _ := ctx.Value(key[T]{}).(*Sink[T])
	return s
}

// Put stores the call's rules, replacing any stored before. The Sink keeps
// rules, which the caller must not change afterwards.
func (s *Sink[T]) Put(rules []T) {
	s.rules.Store(&rules)
}

// Rules returns the rules last put, or nil if none were (or s is nil).
func (s *Sink[T]) Rules() []T {
	if s == nil {
		return nil
	}
	if p := s.rules.Load(); p != nil {
		return *p
	}
	return nil
}
