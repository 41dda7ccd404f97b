package callrules_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/redlimit/redlimit/internal/callrules"
)

func TestSink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	assert.Nil(t, callrules.From[string](ctx), "no sink in a plain context")
	var none *callrules.Sink[string]
	assert.Nil(t, none.Rules(), "a nil sink has no rules")

	ctx, s := callrules.New[string](ctx)
	assert.Same(t, s, callrules.From[string](ctx))
	assert.Nil(t, callrules.From[int](ctx), "a sink of another type is another key")
	assert.Nil(t, s.Rules(), "nothing put yet")
	callrules.From[string](ctx).Put([]string{"a", "b"})
	assert.Equal(t, []string{"a", "b"}, s.Rules())
	s.Put([]string{"c"})
	assert.Equal(t, []string{"c"}, s.Rules(), "the last put wins")
}
