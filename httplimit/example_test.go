package httplimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
)

func Example() {
	// An in-process Redis, so that the example runs anywhere. Its clock is
	// set at the start of a second, so that the three requests fall in one
	// window.
	m, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerSecond(2))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()

	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	handler := httplimit.Middleware(lim)(hello)

	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println("status", rec.Code)
		for _, name := range []string{
			httplimit.HeaderRateLimitPolicy,
			httplimit.HeaderRateLimit,
			httplimit.HeaderRetryAfter,
		} {
			if v := rec.Header().Get(name); v != "" {
				fmt.Printf("%s: %s\n", name, v)
			}
		}
	}
	// Output:
	// status 200
	// RateLimit-Policy: "default";q=2;w=1
	// RateLimit: "default";r=1;t=1
	// status 200
	// RateLimit-Policy: "default";q=2;w=1
	// RateLimit: "default";r=0;t=1
	// status 429
	// RateLimit-Policy: "default";q=2;w=1
	// RateLimit: "default";r=0;t=1
	// Retry-After: 1
}
