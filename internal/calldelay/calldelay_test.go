package calldelay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlimit/redlimit/internal/calldelay"
)

func TestWithFrom(t *testing.T) {
	t.Parallel()
	_, ok := calldelay.From(context.Background())
	assert.False(t, ok, "a context without a bound")
	for _, tt := range []struct{ set, want time.Duration }{
		{time.Second, time.Second},
		{0, 0},
		{-time.Second, 0}, // a negative bound is no Delay at all
	} {
		got, ok := calldelay.From(calldelay.With(context.Background(), tt.set))
		assert.Equal(t, []any{tt.want, true}, []any{got, ok}, "With(%v)", tt.set)
	}
}
