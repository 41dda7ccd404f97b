package main

import (
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFunctionBody checks that -eval finds each function's body in the
// libraries that BENCHMARKS.md quotes: one-line functions (costs.lua) and
// functions whose body runs to a line "end)" (floors.lua).
func TestFunctionBody(t *testing.T) {
	costs, err := os.ReadFile("costs.lua")
	require.NoError(t, err)
	body, err := functionBody(string(costs), "ret")
	require.NoError(t, err)
	assert.Equal(t, "return 1 ", body)
	body, err = functionBody(string(costs), "get")
	require.NoError(t, err)
	assert.Equal(t, "redis.call('GET', KEYS[1]) return 1 ", body)

	floors, err := os.ReadFile("floors.lua")
	require.NoError(t, err)
	body, err = functionBody(string(floors), "fw")
	require.NoError(t, err)
	assert.Contains(t, body, "redis.call('TIME')")
	assert.Contains(t, body, "return struct.pack('<Bi8i8i8B', 0, 999999999 - count, 0, left, 1)")
	assert.NotContains(t, body, "end)", "the body stops before its function's end")
	assert.NotContains(t, body, "fw_incr", "the body stops at its own function's end")

	// Every function of floors.lua has a body (none runs into the next).
	names := regexp.MustCompile(`(?m)^redis\.register_function\('([a-z0-9_]+)'`).FindAllStringSubmatch(string(floors), -1)
	require.NotEmpty(t, names)
	for _, m := range names {
		body, err := functionBody(string(floors), m[1])
		require.NoError(t, err, m[1])
		assert.NotContains(t, body, "register_function", m[1])
	}

	_, err = functionBody(string(floors), "nope")
	assert.Error(t, err)
	_, err = functionBody(string(floors), "t") // a prefix of tb, tgs and time: no function
	assert.Error(t, err)
}
