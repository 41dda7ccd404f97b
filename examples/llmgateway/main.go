// LLMgateway limits an LLM API per API key with one Policy: 5 requests per
// second AND 10,000 tokens per minute AND 200,000 per day. A request reserves its
// max_tokens before it calls the model, then settles with the tokens the
// model really used: the unused ones come back at once, so a key is held
// to what it uses, not to what it asks for. The model is a fake with a seeded random number
// generator, and the embedded miniredis runs on a clock this program moves,
// so the output is the same on every run.
//
//	go run ./examples/llmgateway
package main

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// gateway holds the limits of every API key, and the fake model.
type gateway struct {
	limits *redlimit.Policy // requests per second AND tokens per minute AND per day
	rng    *rand.Rand       // the fake model's
}

func main() {
	log.SetFlags(0)
	m, err := miniredis.Run()
	if err != nil {
		log.Fatalf("llmgateway: %v", err)
	}
	defer m.Close()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(start) // miniredis's TIME stands still until the next SetTime
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	defer rdb.Close()
	ctx := context.Background()

	// Calls take n = tokens. The requests rule counts each call as one
	// (PerCall); the token quotas start over on the minute and at midnight
	// UTC (a SlidingCounter rule would smooth the minute's edge instead).
	limits, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "rps", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(5), PerCall: true},
		{Name: "tpm", Strategy: redlimit.FixedWindow, Limit: redlimit.PerMinute(10_000)},
		{Name: "tpd", Strategy: redlimit.FixedWindow, Limit: redlimit.Limit{Rate: 200_000, Period: 24 * time.Hour}},
	}, redlimit.WithReservationTTL(10*time.Minute)) // no completion takes longer
	if err != nil {
		log.Fatalf("llmgateway: %v", err)
	}
	defer limits.Close()
	g := &gateway{limits: limits, rng: rand.New(rand.NewPCG(1, 2))}

	fmt.Printf("per API key:")
	for _, r := range limits.Rules() {
		fmt.Printf(" %s %v", r.Name, r.Limit)
	}
	fmt.Println()
	at := func(d time.Duration) time.Duration { m.SetTime(start.Add(d)); return d }

	// Three requests of max_tokens 4,000, a second apart: 12,000 asked
	// for in a minute of 10,000. All pass, because each gives back what its
	// completion did not use.
	for i := range 3 {
		g.handle(ctx, at(time.Duration(i)*time.Second), "sk-alice", 4000)
	}
	// More tokens asked for than are left: denied, with the time after
	// which the same request passes.
	retry := g.handle(ctx, at(3*time.Second), "sk-alice", 8000)

	// Seven small requests at once: the sixth and seventh are over 5 per
	// second, whatever their tokens.
	for range 7 {
		g.handle(ctx, at(4*time.Second), "sk-bob", 100)
	}

	// Alice's request again, after the retry-after she was given: it passes.
	g.handle(ctx, at(3*time.Second+retry), "sk-alice", 8000)
}

// handle serves one request of key asking for up to maxTokens, at d on the
// clock, and prints what happened. It returns the retry-after of a denial.
func (g *gateway) handle(ctx context.Context, d time.Duration, key string, maxTokens int) time.Duration {
	fmt.Printf("%-9v %-8s max %4d: ", d.Round(time.Millisecond), key, maxTokens)
	// All or nothing: a request denied for tokens does not count as a
	// request, nor one denied for requests as tokens.
	rv, err := g.limits.Reserve(ctx, key, maxTokens)
	if err != nil {
		log.Fatalf("llmgateway: %v", err) // no decision: answer 503, or serve unlimited
	}
	if res := rv.Result(); !res.Allowed {
		fmt.Printf("429, over %s, retry after %v\n", res.Rule, res.RetryAfter.Round(time.Millisecond))
		return res.RetryAfter
	}
	fmt.Printf("reserved (%5d left meanwhile), ", rv.Result().Remaining)

	used, err := g.complete(maxTokens)
	if err != nil {
		// The model failed: nothing was used, give it all back.
		if cerr := rv.Cancel(ctx); cerr != nil {
			log.Printf("llmgateway: %v", cerr)
		}
		fmt.Printf("502: %v\n", err)
		return 0
	}
	after, err := rv.Settle(ctx, used) // the unused tokens come back
	if err != nil {
		log.Fatalf("llmgateway: %v", err)
	}
	fmt.Printf("used %4d, settled: %5d left\n", used, after.Remaining)
	return 0
}

// complete stands in for the model: like most completions, it stops well
// before maxTokens, between a tenth and three fifths of it.
func (g *gateway) complete(maxTokens int) (int, error) {
	return maxTokens/10 + g.rng.IntN(maxTokens/2+1), nil
}
