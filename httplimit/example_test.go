package httplimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
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

	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
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
	// RateLimit-Policy: "fixed-window";q=2;w=1
	// RateLimit: "fixed-window";r=1;t=1
	// status 200
	// RateLimit-Policy: "fixed-window";q=2;w=1
	// RateLimit: "fixed-window";r=0;t=1
	// status 429
	// RateLimit-Policy: "fixed-window";q=2;w=1
	// RateLimit: "fixed-window";r=0;t=1
	// Retry-After: 1
}

// Behind nginx with proxy_set_header X-Real-IP $remote_addr, a client's own
// X-Forwarded-For reaches the server unchanged: only X-Real-IP, from the
// proxy, is read.
func ExampleIPKey() {
	key := httplimit.IPKey(
		httplimit.WithTrustedProxies(netip.MustParsePrefix("127.0.0.1/32")),
		httplimit.WithRealIPHeader("X-Real-IP"),
	)
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "127.0.0.1:41000"                // nginx
	req.Header.Set("X-Forwarded-For", "198.51.100.1") // from the client
	req.Header.Set("X-Real-IP", "203.0.113.7")        // from nginx
	fmt.Println(key(req))

	req = httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "203.0.113.8:5555" // a client that bypasses nginx
	req.Header.Set("X-Real-IP", "198.51.100.1")
	fmt.Println(key(req))
	// Output:
	// 203.0.113.7 <nil>
	// 203.0.113.8 <nil>
}
