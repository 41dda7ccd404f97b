package calldelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlimit/redlimit/internal/calldelay"
)

func TestBounds(t *testing.T) {
	t.Parallel()
	_, _, ok := calldelay.From(context.Background())
	assert.False(t, ok, "a context without a bound")
	for _, tt := range []struct{ set, want time.Duration }{
		{time.Second, time.Second},
		{0, 0},
		{-time.Second, 0}, // a negative bound is no Delay at all
	} {
		d, deadline, ok := calldelay.From(calldelay.With(context.Background(), tt.set))
		assert.Equal(t, []any{tt.want, true, true}, []any{d, deadline.IsZero(), ok}, "With(%v)", tt.set)
	}
	at := time.Now().Add(time.Minute)
	d, deadline, ok := calldelay.From(calldelay.Until(context.Background(), at))
	assert.Equal(t, []any{time.Duration(0), at, true}, []any{d, deadline, ok}, "Until")
}
