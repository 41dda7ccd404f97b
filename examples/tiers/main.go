// Tiers gives each user the limits of their plan with one Policy: free
// users 2 requests per second AND 20 per hour, paid users 10 per second
// AND 1000 per hour. Both rules of a plan are decided in one script call,
// all or nothing: a request one rule denies takes nothing from the other.
// It runs with nothing installed but Go: it starts an embedded miniredis,
// unless -redis names a real Redis.
//
//	go run ./examples/tiers
//	go run ./examples/tiers -redis 127.0.0.1:6379
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// plans holds each plan's rules. The plans' rules have the same strategies
// and periods, so they share each user's state: a user who upgrades keeps
// what they have used this second and this hour.
var plans = map[string][]redlimit.Rule{
	"free": {
		{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(2)},
		{Name: "hour", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerHour(20)},
	},
	"paid": {
		{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(10)},
		{Name: "hour", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerHour(1000)},
	},
}

// users maps a user to their plan; a real service would read it from the
// user's account or token, in memory: it is asked on every call.
var users = map[string]string{
	"user:alice": "free",
	"user:bob":   "paid",
	"user:dave":  "paid",
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
		m.SetTime(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)) // a fixed clock: the same output every run
		*addr = m.Addr()
	}
	rdb := newClient(*addr)
	defer rdb.Close()
	ctx := context.Background()

	p, err := newPolicy(rdb)
	if err != nil {
		log.Fatalf("tiers: %v", err)
	}
	defer p.Close()
	printPlans()

	// A rule shares state with a single limiter of its strategy, period and
	// prefix. Here two stand for the rules: one records the 995 requests
	// dave made earlier this hour, one shows what he has left this second.
	hour, err := redlimit.NewSlidingCounter(rdb, redlimit.PerHour(1000), redlimit.WithPrefix("tiers"))
	if err != nil {
		log.Fatalf("tiers: %v", err)
	}
	defer hour.Close()
	second, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(10), redlimit.WithPrefix("tiers"))
	if err != nil {
		log.Fatalf("tiers: %v", err)
	}
	defer second.Close()

	for _, user := range []string{"user:alice", "user:bob", "user:dave", "user:erin"} {
		if err := p.Reset(ctx, user); err != nil { // a fresh start on a real Redis
			log.Fatalf("tiers: %v", err)
		}
	}
	if _, err := hour.AllowN(ctx, "user:dave", 995); err != nil {
		log.Fatalf("tiers: %v", err)
	}

	// Denied: the rule that denied, and when to retry. Dave's hour is a
	// sliding window: his 995 requests count, less and less, into the next.
	fmt.Println("\na burst of 12 requests per user (dave has made 995 this hour; erin has no plan):")
	for _, user := range []string{"user:alice", "user:bob", "user:dave", "user:erin"} {
		fmt.Printf("  %-10s %s\n", user, compact(burst(ctx, p, user, 12)))
	}
	res, err := second.AllowN(ctx, "user:dave", 0) // n = 0 consumes nothing
	if err != nil {
		log.Fatalf("tiers: %v", err)
	}
	fmt.Printf("\nuser:dave has %d of his 10 requests this second left: those the hour denied took nothing.\n", res.Remaining)
}

// newClient returns a client of the Redis at addr, with short timeouts and
// no retries.
func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  addr,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		MaxRetries:            -1, // a retried script could count an event twice
		ContextTimeoutEnabled: true,
	})
}

// newPolicy returns the policy of the plans: a user's rules are their
// plan's, asked on every call. The policy's own rules, the free plan's, are
// for users with no plan.
func newPolicy(rdb redis.UniversalClient) (*redlimit.Policy, error) {
	return redlimit.NewPolicy(rdb, plans["free"], redlimit.WithPrefix("tiers"),
		redlimit.WithRulesFunc(func(_ context.Context, user string) ([]redlimit.Rule, error) {
			return plans[users[user]], nil // nil: the policy's own
		}))
}

// printPlans prints the rules of each plan.
func printPlans() {
	for _, plan := range []string{"free", "paid"} {
		fmt.Printf("%s:", plan)
		for _, r := range plans[plan] {
			fmt.Printf(" %s %v", r.Name, r.Limit)
		}
		fmt.Println()
	}
}

// burst makes n calls for user, and returns the answers: "ok", or the rule
// that denied and when to retry.
func burst(ctx context.Context, p *redlimit.Policy, user string, n int) []string {
	var line []string
	for range n {
		res, err := p.Allow(ctx, user)
		if err != nil {
			log.Fatalf("tiers: %v", err)
		}
		if res.Allowed {
			line = append(line, "ok")
		} else {
			line = append(line, fmt.Sprintf("%s (%v)", res.Rule, res.RetryAfter.Round(time.Second/10)))
		}
	}
	return line
}

// compact writes runs of the same answer once, with a count.
func compact(line []string) string {
	var out []string
	for i := 0; i < len(line); {
		j := i
		for j < len(line) && line[j] == line[i] {
			j++
		}
		s := line[i]
		if j-i > 1 {
			s = fmt.Sprintf("%d × %s", j-i, s)
		}
		out = append(out, s)
		i = j
	}
	return strings.Join(out, ", ")
}
