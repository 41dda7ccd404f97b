package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// runT runs a command line and returns its exit status and output.
func runT(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errw bytes.Buffer
	code = run(context.Background(), args, &out, &errw)
	return code, out.String(), errw.String()
}

func TestUsage(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "c.png")
	tests := []struct {
		args       []string
		code       int
		stdout     string // a part of stdout
		stderrLine string // the first line of stderr, exactly
	}{
		{nil, 2, "", ""}, // the usage, then the error
		{[]string{"help"}, 0, "The commands are:", ""},
		{[]string{"help", "simulate"}, 0, "usage: redlimit simulate [flags]", ""},
		{[]string{"help", "inspect"}, 0, "-strategy strategy", ""},
		{[]string{"help", "nope"}, 2, "", `redlimit: unknown help topic "nope"`},
		{[]string{"nope"}, 2, "", `redlimit: unknown command "nope"`},
		{[]string{"simulate", "-h"}, 0, "", "usage: redlimit simulate [flags]"},
		{[]string{"bench", "-help"}, 0, "", "usage: redlimit bench [flags]"},
		{[]string{"simulate", "-bogus"}, 2, "", "redlimit: simulate: flag provided but not defined: -bogus"},
		{[]string{"simulate", "extra"}, 2, "", `redlimit: simulate: unexpected argument "extra"`},
		{[]string{"simulate", "-out", "chart.gif"}, 2, "", `redlimit: simulate: -out "chart.gif": the chart must be a .png or .svg file`},
		{[]string{"simulate", "-pattern", "zigzag", "-out", out}, 2, "", `redlimit: simulate: unknown pattern "zigzag" (want steady, bursty, ramp, onoff or file)`},
		{[]string{"simulate", "-pattern", "file", "-out", out}, 2, "", "redlimit: simulate: -pattern file needs -file"},
		{[]string{"simulate", "-rate", "-1", "-offered", "1", "-out", out}, 2, "", "redlimit: simulate: fixed-window: limit -1/1s: Rate must be at least 1: invalid limit"},
		{[]string{"simulate", "-offered", "1e9", "-out", out}, 2, "", "redlimit: simulate: -offered 1e+09 for 10s is 10000000000 requests, more than the 200000 a simulation can take"},
		{[]string{"simulate", "-file", "/nonexistent/arrivals", "-out", out}, 1, "", "redlimit: open /nonexistent/arrivals: no such file or directory"},
		{[]string{"bench", "-concurrency", "0"}, 2, "", "redlimit: bench: -concurrency 0 must be at least 1"},
		{[]string{"bench", "-strategy", "fast"}, 2, "", `redlimit: bench: invalid value "fast" for flag -strategy: unknown strategy "fast" (want all, fixed-window, sliding-log, sliding-counter, token-bucket, leaky-bucket, sub-window-counter)`},
		{[]string{"inspect", "k"}, 2, "", "redlimit: inspect: -redis is required"},
		{[]string{"inspect", "-redis", "127.0.0.1:1", "-strategy", "token-bucket", "-period", "1s", "k"}, 2, "", "redlimit: inspect: -rate is required"},
		{[]string{"inspect", "-redis", "127.0.0.1:1", "-strategy", "token-bucket", "-period", "1s", "-rate", "5"}, 2, "", "redlimit: inspect: missing KEY"},
		{[]string{"inspect", "-redis", "127.0.0.1:1", "-strategy", "all", "-period", "1s", "-rate", "5", "k"}, 2, "", `redlimit: inspect: invalid value "all" for flag -strategy: unknown strategy "all" (want fixed-window, sliding-log, sliding-counter, token-bucket, leaky-bucket, sub-window-counter)`},
		{[]string{"reset", "-redis", "127.0.0.1:1", "-strategy", "sliding-log", "-period", "1s", "-prefix", "a{b", "k"}, 2, "", `redlimit: reset: prefix "a{b" must not contain '{' or '}' (they would move keys to another cluster slot): invalid argument`},
		{[]string{"reset", "-redis", "127.0.0.1:1", "-period", "1s", "k"}, 2, "", "redlimit: reset: -strategy is required"},
		{[]string{"reset", "-redis", "127.0.0.1:1", "-strategy", "token-bucket", "k"}, 2, "", "redlimit: reset: -period is required"},
		{[]string{"reset", "-redis", "127.0.0.1:1", "-timeout", "0s", "-strategy", "token-bucket", "-period", "1s", "k"}, 2, "", "redlimit: reset: -timeout 0s must be positive and at most 1m0s"},
		{[]string{"inspect", "-redis", "127.0.0.1:1", "-strategy", "token-bucket", "-period", "1s", "-rate", "5", "k", "k2"}, 2, "", "redlimit: inspect: want one KEY, got 2 arguments"},
		{[]string{"inspect", "-redis", "127.0.0.1:1", "-strategy", "token-bucket", "-period", "1s", "-rate", "5", ""}, 2, "", "redlimit: inspect: empty KEY"},
		// -rule and -concurrency: the same checks, without -strategy and
		// -period; a bad prefix fails before any network traffic.
		{[]string{"reset", "-rule", "a=token-bucket:1/1s", "k"}, 2, "", "redlimit: reset: -redis is required"},
		{[]string{"reset", "-redis", "127.0.0.1:1", "-timeout", "0s", "-concurrency", "k"}, 2, "", "redlimit: reset: -timeout 0s must be positive and at most 1m0s"},
		{[]string{"inspect", "-redis", "127.0.0.1:1", "-concurrency", "-max", "3"}, 2, "", "redlimit: inspect: missing KEY"},
		{[]string{"reset", "-redis", "127.0.0.1:1", "-rule", "a=token-bucket:1/1s", "k", "k2"}, 2, "", "redlimit: reset: want one KEY, got 2 arguments"},
		{[]string{"reset", "-redis", "127.0.0.1:1", "-concurrency", ""}, 2, "", "redlimit: reset: empty KEY"},
		{[]string{"inspect", "-redis", "127.0.0.1:1", "-prefix", "a{b", "-rule", "a=token-bucket:1/1s", "k"}, 2, "", `redlimit: inspect: prefix "a{b" must not contain '{' or '}' (they would move keys to another cluster slot): invalid argument`},
		{[]string{"reset", "-redis", "127.0.0.1:1", "-prefix", "a{b", "-rule", "a=token-bucket:1/1s", "k"}, 2, "", `redlimit: reset: prefix "a{b" must not contain '{' or '}' (they would move keys to another cluster slot): invalid argument`},
	}
	for _, tt := range tests {
		code, stdout, stderr := runT(t, tt.args...)
		assert.Equal(t, tt.code, code, "%q: exit %d, want %d (stderr %q)", tt.args, code, tt.code, stderr)
		assert.Contains(t, stdout, tt.stdout, "%q: stdout %q, want it to contain %q", tt.args, stdout, tt.stdout)
		if tt.stderrLine != "" {
			first, _, _ := strings.Cut(stderr, "\n")
			assert.Equal(t, tt.stderrLine, first, "%q: stderr starts %q, want %q", tt.args, first, tt.stderrLine)
		}
		if tt.code == 2 && tt.stderrLine != "" {
			assert.Contains(t, stderr, "Run 'redlimit help", "%q: stderr %q does not point to the help", tt.args, stderr)
		}
	}
}

// TestUnreachableRedis checks that a Redis that does not answer is a
// runtime failure (exit 1), reported in one line.
func TestUnreachableRedis(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"inspect", "-redis", "127.0.0.1:1", "-strategy", "token-bucket", "-rate", "5", "-period", "1s", "k"},
		{"reset", "-redis", "127.0.0.1:1", "-strategy", "token-bucket", "-period", "1s", "k"},
		{"bench", "-redis", "127.0.0.1:1", "-duration", "10ms"},
		{"inspect", "-redis", "127.0.0.1:1", "-rule", "a=token-bucket:1/1s", "k"},
		{"reset", "-redis", "127.0.0.1:1", "-rule", "a=token-bucket:1/1s", "k"},
		{"inspect", "-redis", "127.0.0.1:1", "-concurrency", "-max", "3", "k"},
		{"reset", "-redis", "127.0.0.1:1", "-concurrency", "k"},
	} {
		code, _, stderr := runT(t, args...)
		assert.Equal(t, 1, code, "%q: exit %d, stderr %q; want 1 and one line about Redis", args, code, stderr)
		assert.True(t, strings.HasPrefix(stderr, "redlimit: cannot reach Redis at 127.0.0.1:1: "), "%q: exit %d, stderr %q; want 1 and one line about Redis", args, code, stderr)
		assert.Equal(t, 1, strings.Count(stderr, "\n"), "%q: exit %d, stderr %q; want 1 and one line about Redis", args, code, stderr)
	}
}
