package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// The library's own hot path, without the Redis round trip.

func BenchmarkStateKey(b *testing.B) {
	b.ReportAllocs()
	l := benchLimiter(b)
	for b.Loop() {
		_ = l.stateKey("user:12345")
	}
}

func BenchmarkStateKeyEscaped(b *testing.B) {
	b.ReportAllocs()
	l := benchLimiter(b)
	for b.Loop() {
		_ = l.stateKey("{user}:12345")
	}
}

// benchLimiter is a token bucket on a client that is never used.
func benchLimiter(b *testing.B) *RateLimiter {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	b.Cleanup(func() { rdb.Close() })
	l, err := NewTokenBucket(rdb, PerSecond(10))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

func BenchmarkParseReply(b *testing.B) {
	b.ReportAllocs()
	l := benchLimiter(b)
	reply := []any{int64(0), int64(9), int64(0), int64(100000), int64(1)}
	for b.Loop() {
		if _, _, err := l.parse(reply, l.own, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParsePackedReply decodes the reply real Redis sends: one string.
func BenchmarkParsePackedReply(b *testing.B) {
	b.ReportAllocs()
	l := benchLimiter(b)
	var reply any = packed([5]int64{0, 9, 0, 100000, 1})
	for b.Loop() {
		if _, _, err := l.parse(reply, l.own, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFallback is a decision while Redis is marked down, for an
// existing key; BenchmarkRateAllow is the bare x/time/rate call it wraps.
func BenchmarkFallback(b *testing.B) {
	for _, s := range []Strategy{FixedWindow, TokenBucket, LeakyBucket} {
		b.Run(s.String(), func(b *testing.B) {
			m := miniredis.RunT(b)
			rdb := tunedClient(b, m.Addr())
			lim, err := New(rdb, s, Limit{Rate: 100_000, Period: time.Second}, WithPingInterval(time.Hour))
			require.NoError(b, err)
			defer lim.(*RateLimiter).Close()
			m.Close()
			ctx := context.Background()
			_, _ = lim.Allow(ctx, "k") // marks Redis down, creates the key's limiter
			b.ReportAllocs()
			for b.Loop() {
				if res, err := lim.Allow(ctx, "k"); err != nil || !res.Degraded {
					b.Fatal(res, err)
				}
			}
		})
	}
}

func BenchmarkRateAllow(b *testing.B) {
	lim := rate.NewLimiter(1<<30, 1<<30)
	b.ReportAllocs()
	for b.Loop() {
		lim.Allow()
	}
}

// BenchmarkDecisionMiniredis is a whole decision, through go-redis, on an
// embedded miniredis: it measures the library and the client, not Redis.
func BenchmarkDecisionMiniredis(b *testing.B) {
	for _, s := range Strategies() {
		b.Run(s.String(), func(b *testing.B) {
			m := miniredis.RunT(b)
			rdb := tunedClient(b, m.Addr())
			lim, err := New(rdb, s, Limit{Rate: 100, Period: time.Millisecond})
			require.NoError(b, err)
			defer lim.(*RateLimiter).Close()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := lim.Allow(ctx, "k"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// stubClient answers every script with a fixed reply and no I/O, so that
// a benchmark sees the library's own cost of a decision.
type stubClient struct {
	redis.UniversalClient // nil: calling anything else panics
	cmd                   *redis.Cmd
	fcalls                int
}

func newStubClient() *stubClient {
	reply := []any{int64(0), int64(9), int64(0), int64(100000), int64(1)}
	return &stubClient{cmd: redis.NewCmdResult(reply, nil)}
}

func (s *stubClient) EvalSha(context.Context, string, []string, ...any) *redis.Cmd { return s.cmd }
func (s *stubClient) Eval(context.Context, string, []string, ...any) *redis.Cmd    { return s.cmd }
func (s *stubClient) FCall(context.Context, string, []string, ...any) *redis.Cmd {
	s.fcalls++
	return s.cmd
}

// BenchmarkDecisionOverhead is a whole decision without the round trip:
// key name, arguments, script call, reply decoding.
func BenchmarkDecisionOverhead(b *testing.B) {
	lim, err := NewTokenBucket(newStubClient(), PerSecond(10))
	require.NoError(b, err)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := lim.Allow(ctx, "user:12345"); err != nil {
			b.Fatal(err)
		}
	}
}

// The library allocates at most 2 times per decision, round trip excluded.
func TestDecisionAllocs(t *testing.T) {
	ctx := context.Background()
	for name, opts := range map[string][]Option{
		"no options":         nil,
		"WithBlock":          {WithBlock(time.Second)},
		"WithRedisFunctions": {WithRedisFunctions()},
	} {
		stub := newStubClient()
		lim, err := NewTokenBucket(stub, PerSecond(10), opts...)
		require.NoError(t, err)
		allocs := testing.AllocsPerRun(1000, func() {
			if _, err := lim.Allow(ctx, "user:12345"); err != nil {
				t.Fatal(err)
			}
		})
		t.Logf("%s: %.0f allocations per decision", name, allocs)
		assert.LessOrEqual(t, allocs, 2.0, "%s: %.0f allocations per decision, want at most 2", name, allocs)
		assert.Equal(t, name == "WithRedisFunctions" || functionsByDefault, stub.fcalls > 0, "%s: %d FCALLs", name, stub.fcalls)
	}
}
