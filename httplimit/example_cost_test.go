package httplimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
)

// An LLM endpoint limited by requests per minute and tokens per hour: each
// request reserves its X-Max-Tokens, and the handler reports the tokens it
// used. The second request fits only because the first gave back what it
// did not use; the third is denied by the tokens rule, whose fields its
// 429 carries.
func ExampleWithCost() {
	m, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	p, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "requests", Strategy: redlimit.TokenBucket, Limit: redlimit.PerMinute(60), PerCall: true},
		{Name: "tokens", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(1000)},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	chat := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		httplimit.Report(r, 200) // the model used 200 tokens
	})
	handler := httplimit.Middleware(p, httplimit.WithCost(func(r *http.Request) int {
		n, _ := strconv.Atoi(r.Header.Get("X-Max-Tokens"))
		return n
	}))(chat)

	for range 3 {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		req.Header.Set("X-Max-Tokens", "700")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get(httplimit.HeaderRateLimit))
	}
	// Output:
	// 200 "tokens";r=300;t=3600
	// 200 "tokens";r=100;t=3600
	// 429 "tokens";r=600;t=3600
}
