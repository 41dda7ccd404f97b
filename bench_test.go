package redlimit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"golang.org/x/time/rate"
)

// The library's own hot path, without the Redis round trip.

func BenchmarkStateKey(b *testing.B) {
	b.ReportAllocs()
	l := &RateLimiter{cfg: defaultConfig(), suffix: "}:tb1000000"}
	for b.Loop() {
		_ = l.stateKey("user:12345")
	}
}

func BenchmarkStateKeyEscaped(b *testing.B) {
	b.ReportAllocs()
	l := &RateLimiter{cfg: defaultConfig(), suffix: "}:tb1000000"}
	for b.Loop() {
		_ = l.stateKey("{user}:12345")
	}
}

func BenchmarkParseReply(b *testing.B) {
	b.ReportAllocs()
	l := &RateLimiter{alg: tokenBucket, limit: PerSecond(10)}
	reply := []any{int64(1), int64(9), int64(0), int64(100000), int64(0), int64(0)}
	for b.Loop() {
		if _, _, err := l.parse(reply); err != nil {
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
			lim, err := New(rdb, s, Limit{Rate: 1 << 30, Period: time.Second}, WithPingInterval(time.Hour))
			if err != nil {
				b.Fatal(err)
			}
			defer lim.(*RateLimiter).Close()
			m.Close()
			ctx := context.Background()
			lim.Allow(ctx, "k") // marks Redis down, creates the key's limiter
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

func BenchmarkDenyCacheHit(b *testing.B) {
	c := newDenyCache(10_000)
	c.remember("hot", 1, time.Hour)
	limit := PerSecond(10)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := c.lookup("hot", 1, limit); !ok {
				b.Fatal("miss")
			}
		}
	})
}

func BenchmarkDenyCacheMiss(b *testing.B) {
	c := newDenyCache(10_000)
	for i := range 5000 {
		c.remember("k"+strconv.Itoa(i), 1, time.Hour)
	}
	limit := PerSecond(10)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := c.lookup("absent", 1, limit); ok {
				b.Fatal("hit")
			}
		}
	})
}

// BenchmarkDecisionMiniredis is a whole decision, through go-redis, on an
// embedded miniredis: it measures the library and the client, not Redis.
func BenchmarkDecisionMiniredis(b *testing.B) {
	for _, s := range Strategies() {
		b.Run(s.String(), func(b *testing.B) {
			m := miniredis.RunT(b)
			rdb := tunedClient(b, m.Addr())
			lim, err := New(rdb, s, Limit{Rate: MaxSlidingLogRate, Period: time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
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
