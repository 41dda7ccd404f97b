package grpclimit_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redlimit/redlimit/grpclimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every error message names the package once: one wrapping ErrNoKey does
// not repeat "grpclimit:".
func TestErrorMessagesOnePrefix(t *testing.T) {
	ctx := context.Background()
	_, peerErr := grpclimit.PeerKey(ctx, "/svc/M")
	_, mdErr := grpclimit.MetadataKey("x-api-key")(ctx, "/svc/M")
	for name, err := range map[string]error{"no peer": peerErr, "no metadata": mdErr} {
		require.ErrorIs(t, err, grpclimit.ErrNoKey, name)
		msg := err.Error()
		assert.True(t, strings.HasPrefix(msg, "grpclimit: "), "%s: %q", name, msg)
		assert.Equal(t, 1, strings.Count(msg, "grpclimit: "), "%s: %q", name, msg)
	}
}
