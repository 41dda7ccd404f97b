package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit/internal/redistest"
)

// go-redis's AutoPipeliner batches concurrent commands into pipelines; a
// limiter given one works as with a plain client: scripts, NOSCRIPT
// recovery, and the fallback when Redis dies and comes back.
func TestAutoPipeliner(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(redistest.TunedOptions(srv.Addr))
	defer rdb.Close()
	ap, err := rdb.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	defer ap.Close()
	for _, s := range Strategies() {
		lim := newLimiter(t, ap, s, Limit{Rate: 5, Period: time.Hour, Burst: 5}, WithPingInterval(20*time.Millisecond))
		ctx := context.Background()
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			res, err := lim.Allow(ctx, "k")
			if err != nil || res.Degraded || res.Allowed != (i < 5) {
				t.Fatalf("%v call %d through the AutoPipeliner: %+v, %v", s, i, res, err)
			}
		}
	}
	// Under load, Redis dies and comes back.
	lim := newLimiter(t, ap, TokenBucket, PerSecond(100_000))
	ld := startLoad(lim, 32)
	time.Sleep(300 * time.Millisecond)
	killAt := ld.now()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	upAt := ld.now()
	time.Sleep(2 * time.Second)
	r := report(ld.finish(), killAt, upAt)
	t.Logf("AutoPipeliner, crash: %v", r)
	if r.errors > 0 {
		t.Errorf("%d errors returned to callers, first %v", r.errors, r.firstErr)
	}
	if r.degraded == 0 {
		t.Error("no fallback decision while Redis was down")
	}
	if r.back < 0 || r.back > 1500*time.Millisecond {
		t.Errorf("back on Redis %v after the restart, want within 1.5s", r.back)
	}
}
