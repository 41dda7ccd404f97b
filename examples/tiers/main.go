// Tiers gives each user the limit of their plan: free users 5 requests per
// minute, paid users 100, with one limiter per tier. Then it limits users
// by two limits at once, 10 per second and 100 per hour. It runs with
// nothing installed but Go: it starts an embedded miniredis, unless -redis
// names a real Redis.
//
//	go run ./examples/tiers
//	go run ./examples/tiers -redis 127.0.0.1:6379
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// users maps a user to their plan; a real service would read it from the
// user's account or token.
var users = map[string]string{
	"user:alice": "free",
	"user:bob":   "paid",
}

func main() {
	addr := flag.String("redis", "", "address of a Redis to use instead of an embedded miniredis")
	flag.Parse()
	log.SetFlags(0)

	if *addr == "" {
		m, err := miniredis.Run()
		if err != nil {
			log.Fatalf("tiers: %v", err)
		}
		defer m.Close()
		*addr = m.Addr()
	}
	rdb := redis.NewClient(&redis.Options{
		Addr:                  *addr,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		MaxRetries:            -1, // a retried script could count an event twice
		ContextTimeoutEnabled: true,
	})
	defer rdb.Close()
	ctx := context.Background()

	// One limiter per tier. Their prefixes keep the tiers' counts apart. With
	// one prefix, the two limiters (same strategy and Period, different
	// Rate) would share each user's state: also a valid choice, in which a
	// user who upgrades keeps what they have used this minute.
	tiers := map[string]*redlimit.RateLimiter{
		"free": newLimiter(rdb, redlimit.PerMinute(5), "tiers-free"),
		"paid": newLimiter(rdb, redlimit.PerMinute(100), "tiers-paid"),
	}
	limiterFor := func(user string) *redlimit.RateLimiter {
		if lim, ok := tiers[users[user]]; ok {
			return lim
		}
		return tiers["free"] // unknown users get the free plan
	}

	fmt.Printf("tiers: free %v, paid %v; a burst of 8 requests per user:\n", tiers["free"].Limit(), tiers["paid"].Limit())
	for _, user := range []string{"user:alice", "user:bob"} {
		lim := limiterFor(user)
		reset(ctx, user, lim)
		allowed, denied := 0, 0
		var retry time.Duration
		for range 8 {
			res, err := lim.Allow(ctx, user)
			if err != nil {
				log.Fatalf("tiers: %v", err)
			}
			if res.Allowed {
				allowed++
			} else {
				denied++
				retry = res.RetryAfter
			}
		}
		fmt.Printf("  %-10s (%s): %d allowed, %d denied", user, users[user], allowed, denied)
		if denied > 0 {
			fmt.Printf(", retry after %v", retry.Round(100*time.Millisecond))
		}
		fmt.Println()
	}

	// Two limits at once: 10 per second AND 100 per hour; both must allow.
	// Limiters with different Periods (or strategies) never share state,
	// even with one prefix: each keeps its own Redis key per user.
	//
	// Each limiter consumes when it allows, and nothing is refunded when the
	// other one then denies. So check first the one whose events are cheap
	// to lose: the per-second limit, which refills in 100ms and denies
	// bursts. The hourly quota is then spent only on requests that passed
	// it. To also spare the per-second limit when the hour is used up, peek
	// at the hour first with AllowN(ctx, key, 0), which consumes nothing
	// (one more round trip; the final hourly Allow still decides, so a
	// race with other instances never admits too much).
	both := dual{
		perSecond: newLimiter(rdb, redlimit.PerSecond(10), "tiers"),
		perHour:   newLimiter(rdb, redlimit.PerHour(100), "tiers"),
	}
	fmt.Printf("\ntwo limits at once, %v and %v:\n", both.perSecond.Limit(), both.perHour.Limit())
	for _, c := range []struct {
		user     string
		usedHour int // requests already made this hour
		burst    int
		peek     bool
	}{
		{"user:carol", 0, 15, false},
		{"user:dave", 95, 8, false},
		{"user:erin", 95, 8, true},
	} {
		reset(ctx, c.user, both.perSecond, both.perHour)
		if c.usedHour > 0 { // simulate an earlier part of the hour
			if _, err := both.perHour.AllowN(ctx, c.user, c.usedHour); err != nil {
				log.Fatalf("tiers: %v", err)
			}
		}
		allowed, deniedSecond, deniedHour := 0, 0, 0
		for range c.burst {
			ok, by, err := both.allow(ctx, c.user, c.peek)
			if err != nil {
				log.Fatalf("tiers: %v", err)
			}
			switch {
			case ok:
				allowed++
			case by == both.perSecond:
				deniedSecond++
			default:
				deniedHour++
			}
		}
		sec := remaining(ctx, both.perSecond, c.user)
		hour := remaining(ctx, both.perHour, c.user)
		peek := ""
		if c.peek {
			peek = ", peeks"
		}
		fmt.Printf("  %-10s (%d used this hour%s) %d requests: %d allowed, %d denied by the second, %d by the hour; left %d/s, %d/h\n",
			c.user, c.usedHour, peek, c.burst, allowed, deniedSecond, deniedHour, sec, hour)
	}
	fmt.Println("\nThe requests the hour denied still used up user:dave's per-second events\n(nothing is refunded); user:erin peeked at the hour first and kept hers.")

	for _, lim := range []*redlimit.RateLimiter{tiers["free"], tiers["paid"], both.perSecond, both.perHour} {
		lim.Close()
	}
}

// dual is a pair of limits that must both allow.
type dual struct{ perSecond, perHour *redlimit.RateLimiter }

// allow reports whether key may make one request, and if not, which limiter
// denied it.
func (d dual) allow(ctx context.Context, key string, peek bool) (bool, *redlimit.RateLimiter, error) {
	if peek {
		res, err := d.perHour.AllowN(ctx, key, 0)
		if err != nil || res.Remaining < 1 {
			return false, d.perHour, err
		}
	}
	for _, lim := range []*redlimit.RateLimiter{d.perSecond, d.perHour} {
		res, err := lim.Allow(ctx, key)
		if err != nil || !res.Allowed {
			return false, lim, err
		}
	}
	return true, nil, nil
}

func newLimiter(rdb redis.UniversalClient, limit redlimit.Limit, prefix string) *redlimit.RateLimiter {
	lim, err := redlimit.NewTokenBucket(rdb, limit, redlimit.WithPrefix(prefix))
	if err != nil {
		log.Fatalf("tiers: %v", err)
	}
	return lim
}

// reset starts key from a fresh state on a real Redis.
func reset(ctx context.Context, key string, lims ...*redlimit.RateLimiter) {
	for _, lim := range lims {
		if err := lim.Reset(ctx, key); err != nil {
			log.Fatalf("tiers: %v", err)
		}
	}
}

// remaining peeks at what key has left, without consuming.
func remaining(ctx context.Context, lim *redlimit.RateLimiter, key string) int {
	res, err := lim.AllowN(ctx, key, 0)
	if err != nil {
		log.Fatalf("tiers: %v", err)
	}
	return res.Remaining
}
