// Command priorities is an HTTP service whose requests share one limit, in
// which health checks and logins are Critical, a bulk export Sheddable and
// the rest Normal: with redlimit.WithPriorityShares(0.5, 0.8), exports may
// use half of the limit and ordinary pages 80%, so that a flood of exports
// or pages never takes the last 20% that logins and health checks keep.
//
// It needs nothing installed: without -redis it starts an embedded
// miniredis. Run it with
//
//	go run ./examples/priorities                   # serve on 127.0.0.1:8080
//	go run ./examples/priorities -selftest         # send requests, print, exit
//
// and try it with curl -i http://127.0.0.1:8080/export. The limit is 10
// requests a minute for the whole service (one key), a fixed window.
//
// With -selftest it listens on a free loopback port (unless -addr is given),
// sends 8 exports, 4 page views, a login, a health check and one more
// page view, prints each status, and exits: 0 if exactly 5 exports and 3
// pages were served, then the login and the health check (from the 20%
// kept for them), and not the last page, 1 otherwise. CI can run it that
// way.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
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

// limit is the service's: 10 requests a minute, whoever sends them.
var limit = redlimit.PerMinute(10)

// priority gives each request its priority.
func priority(r *http.Request) redlimit.Priority {
	switch r.URL.Path {
	case "/healthz", "/login":
		return redlimit.Critical
	case "/export":
		return redlimit.Sheddable
	}
	return redlimit.Normal
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on (with -selftest, default a free loopback port)")
	redisAddr := flag.String("redis", "", "Redis address (host:port); empty starts an embedded miniredis")
	selftest := flag.Bool("selftest", false, "send requests to the server, print the answers and exit")
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
		if selftest {
			// Time stands still: no window ends during the self test.
			m.SetTime(time.Now().Truncate(time.Minute))
		}
		redisAddr = m.Addr()
		log.Printf("embedded miniredis on %s", redisAddr)
	}
	rdb := newClient(redisAddr)
	defer rdb.Close()

	lim, err := redlimit.NewFixedWindow(rdb, limit, redlimit.WithPrefix("priorities"),
		redlimit.WithPriorityShares(0.5, 0.8))
	if err != nil {
		return err
	}
	defer lim.Close()
	if selftest { // a fresh window: the self test's counts are exact
		if err := lim.Reset(context.Background(), "service"); err != nil {
			return err
		}
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	log.Printf("serving on http://%s/ (limit %v for the service; /export sheddable, /login and /healthz critical)", ln.Addr(), limit)
	return serve(ln, newHandler(lim), selftest)
}

// newClient returns a client of the Redis at addr, with short timeouts and
// no retries.
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

// newHandler returns the server's handler: every path under one key, the
// whole service's, each request at the priority of its path.
func newHandler(lim *redlimit.RateLimiter) http.Handler {
	mux := http.NewServeMux()
	for _, path := range []string{"/", "/healthz", "/login", "/export"} {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, "ok", r.URL.Path)
		})
	}
	return httplimit.Middleware(lim,
		httplimit.WithKeyFunc(func(*http.Request) (string, error) { return "service", nil }),
		httplimit.WithPriority(priority))(mux)
}

// serve serves handler on ln until SIGINT or SIGTERM, or with selftest
// until the self test has run, then shuts the server down.
func serve(ln net.Listener, handler http.Handler, selftest bool) error {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var testErr error
	if selftest {
		testErr = selfTest(ctx, "http://"+ln.Addr().String())
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

// selfTest sends the requests and checks how many of each were served.
func selfTest(ctx context.Context, base string) error {
	client := &http.Client{Timeout: 5 * time.Second}
	var bad []string
	for _, c := range []struct {
		path       string
		sent, want int
	}{
		{"/export", 8, 5},  // Sheddable: half of 10
		{"/", 4, 3},        // Normal: up to 8 used
		{"/login", 1, 1},   // Critical: the rest
		{"/healthz", 1, 1}, // (the last one)
		{"/", 1, 0},
	} {
		ok := 0
		for i := 0; i < c.sent; i++ {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+c.path, nil)
			if err != nil {
				return err
			}
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			fmt.Printf("GET %-9s %d %s\n", c.path, resp.StatusCode, resp.Header.Get(httplimit.HeaderRetryAfter))
			if resp.StatusCode == http.StatusOK {
				ok++
			}
		}
		if ok != c.want {
			bad = append(bad, fmt.Sprintf("%s: %d of %d served, want %d", c.path, ok, c.sent, c.want))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("selftest: %v", bad)
	}
	fmt.Println("selftest: ok")
	return nil
}
