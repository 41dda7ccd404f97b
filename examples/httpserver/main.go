// Command httpserver is an HTTP server whose requests are rate-limited per
// client IP address by a redlimit token bucket, through the httplimit
// middleware.
//
// It needs nothing installed: without -redis it starts an embedded
// miniredis. Run it with
//
//	go run ./examples/httpserver                   # serve on 127.0.0.1:8080
//	go run ./examples/httpserver -redis localhost:6379
//	go run ./examples/httpserver -selftest         # send 5 requests, print, exit
//
// and try it with curl -i http://127.0.0.1:8080/. The limit is a bucket of
// 3 requests refilled at 2 per second, so the 4th request of a quick burst
// is answered 429 Too Many Requests.
//
// With -selftest it listens on a free loopback port (unless -addr is given),
// sends 5 requests to itself, prints the status and the rate-limit header
// fields of each, and exits: 0 if every answer was 200 or 429 and at least
// one was 429, 1 otherwise. CI can run it that way.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
)

// limit is the token bucket of every client: bursts of 3, then 2 per second.
var limit = redlimit.Limit{Rate: 2, Period: time.Second, Burst: 3}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on (with -selftest, default a free loopback port)")
	redisAddr := flag.String("redis", "", "Redis address (host:port); empty starts an embedded miniredis")
	selftest := flag.Bool("selftest", false, "send 5 requests to the server, print the answers and exit")
	flag.Parse()

	addrSet := false
	flag.Visit(func(f *flag.Flag) { addrSet = addrSet || f.Name == "addr" })
	if *selftest && !addrSet {
		*addr = "127.0.0.1:0"
	}
	if err := run(*addr, *redisAddr, *selftest); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func run(addr, redisAddr string, selftest bool) error {
	if redisAddr == "" {
		m, err := miniredis.Run()
		if err != nil {
			return fmt.Errorf("start miniredis: %w", err)
		}
		defer m.Close()
		redisAddr = m.Addr()
		log.Printf("embedded miniredis on %s", redisAddr)
	}
	rdb := newClient(redisAddr)
	defer rdb.Close()

	lim, err := redlimit.NewTokenBucket(rdb, limit, redlimit.WithPrefix("httpserver"))
	if err != nil {
		return err
	}
	defer lim.Close()
	handler := newHandler(lim)

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Printf("serving on http://%s/ (limit %v per client IP)", ln.Addr(), limit)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var testErr error
	if selftest {
		testErr = selfTest(ctx, "http://"+ln.Addr().String()+"/")
	} else {
		select {
		case <-ctx.Done():
		case err := <-served:
			return err
		}
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return testErr
}

// newClient returns a client of the Redis at addr with the options the
// README recommends for a limiter on the hot path: short timeouts, so that
// a slow Redis is an outage (the fallback answers) rather than a slow
// request, and no retries, since a retried script could count an event
// twice.
func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  addr,
		DialTimeout:           100 * time.Millisecond,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		PoolTimeout:           100 * time.Millisecond,
		MaxRetries:            -1,
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
	})
}

// newHandler returns the server's handler: hello, for each client IP as
// often as lim lets it.
func newHandler(lim *redlimit.RateLimiter) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello")
	})
	// The key is the client IP (RemoteAddr). Behind a reverse proxy, name
	// the proxy and the one header it sets, for example nginx appending to
	// X-Forwarded-For:
	//	httplimit.WithKeyFunc(httplimit.IPKey(
	//		httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")),
	//		httplimit.WithXForwardedFor(1)))
	return httplimit.Middleware(lim, httplimit.WithXRateLimitHeaders(true))(mux)
}

// selfTest sends 5 requests to url and prints each answer.
func selfTest(ctx context.Context, url string) error {
	client := &http.Client{Timeout: 5 * time.Second}
	denied := 0
	for i := 1; i <= 5; i++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body) // read to the end, so that the connection is reused
		resp.Body.Close()
		fmt.Printf("request %d: %s\n", i, resp.Status)
		for _, name := range []string{
			httplimit.HeaderRateLimitPolicy,
			httplimit.HeaderRateLimit,
			httplimit.HeaderXRateLimitLimit,
			httplimit.HeaderXRateLimitRemaining,
			httplimit.HeaderXRateLimitReset,
			httplimit.HeaderRetryAfter,
		} {
			if v := resp.Header.Get(name); v != "" {
				fmt.Printf("  %s: %s\n", name, v)
			}
		}
		switch resp.StatusCode {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			denied++
		default:
			return fmt.Errorf("selftest: request %d: unexpected status %s", i, resp.Status)
		}
	}
	if denied == 0 {
		return fmt.Errorf("selftest: no request was denied, want some (burst %d < 5)", limit.Burst)
	}
	return nil
}
