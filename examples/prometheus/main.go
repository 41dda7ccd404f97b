// Command prometheus exports redlimit's decisions as Prometheus metrics
// with package github.com/redlimit/redlimit/extra/redlimitprom: one
// Collector, registered once, and each limiter built with its Options
// under a name. It is its own module, so that redlimit itself does not
// depend on Prometheus.
//
// It needs nothing installed: without -redis it starts an embedded
// miniredis. Run it from the repository root (its go.work puts this module
// in the workspace) with
//
//	go run ./examples/prometheus                 # serve http://127.0.0.1:9464/metrics, with demo traffic
//	go run ./examples/prometheus -redis localhost:6379
//	go run ./examples/prometheus -selftest       # make ~20 decisions, print the metrics, check them, exit
//
// With -selftest it listens on a free loopback port (unless -addr is
// given), makes 21 decisions that are allowed, denied for every reason,
// shadowed and (with the embedded miniredis, which it stops for a moment)
// degraded, fetches /metrics, prints the redlimit_ series and exits: 0 if
// they match the decisions made, 1 otherwise.
//
// The metrics are redlimitprom's (see its package documentation):
//
//	redlimit_decisions_total{limiter,strategy,rule,outcome,denied_by,degraded,shadowed}
//	redlimit_decision_seconds{...}                   histogram of the time to decide
//	redlimit_fallback_active{limiter,node}           1 while on the fallback
//	redlimit_fallback_transitions_total{limiter,node,to}  to: fallback, redis
//	redlimit_prefetch_*{limiter}                     hot-key prefetches (WithPrefetch)
//
// No metric has the limited key (user, IP address, token) as a label:
// keys are unbounded, chosen by callers (attackers included), and every
// label value is a series that Prometheus keeps.
package main

import (
	"bufio"
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/extra/redlimitprom"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9464", "address to serve /metrics on (with -selftest, default a free loopback port)")
	redisAddr := flag.String("redis", "", "Redis address (host:port); empty starts an embedded miniredis")
	selftest := flag.Bool("selftest", false, "make some decisions, print and check the metrics, and exit")
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

// metrics feeds a redlimitprom.Collector and logs the fallback's
// transitions.
type metrics struct {
	c *redlimitprom.Collector
}

// newMetrics makes the collector and registers it with reg (in a service,
// its own registry or prometheus.DefaultRegisterer).
func newMetrics(reg prometheus.Registerer) *metrics {
	c := redlimitprom.NewCollector()
	reg.MustRegister(c)
	return &metrics{c: c}
}

// options returns the options of the limiter named limiter: the
// collector's hooks, and a transition hook that logs too.
func (m *metrics) options(limiter string) []redlimit.Option {
	return []redlimit.Option{redlimit.WithObserver(m.c.Observer(limiter)), redlimit.WithOnTransition(m.transition(limiter, nil))}
}

// transition returns the fallback hook of limiter: the collector's, a log
// line (once per switch, never per call), then then's, if not nil.
func (m *metrics) transition(limiter string, then func(redlimit.Transition)) func(redlimit.Transition) {
	record := m.c.OnTransition(limiter)
	return func(t redlimit.Transition) {
		record(t)
		switch {
		case t.Evicted > 0:
		case t.Down:
			log.Printf("%s: Redis unavailable, deciding in-process: %v", limiter, t.Err)
		default:
			log.Printf("%s: back on Redis after %v", limiter, t.Outage.Round(time.Millisecond))
		}
		if then != nil {
			then(t)
		}
	}
}

func run(addr, redisAddr string, selftest bool) error {
	var mr *miniredis.Miniredis
	if redisAddr == "" {
		var err error
		if mr, err = miniredis.Run(); err != nil {
			return fmt.Errorf("start miniredis: %w", err)
		}
		defer mr.Close()
		redisAddr = mr.Addr()
	}
	rdb := newClient(redisAddr)
	defer rdb.Close()

	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/metrics"

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var testErr error
	if selftest {
		testErr = selfTest(ctx, rdb, mr, m, url, os.Stdout)
	} else {
		log.Printf("serving %s, with demo traffic; ^C to stop", url)
		if err := demo(ctx, rdb, m); err != nil {
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

// newClient returns a client of the Redis at addr, with short timeouts and
// no retries.
func newClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  addr,
		DialTimeout:           100 * time.Millisecond,
		DialerRetries:         1,
		ReadTimeout:           100 * time.Millisecond,
		WriteTimeout:          100 * time.Millisecond,
		MaxRetries:            -1, // a retried script could count an event twice
		ContextTimeoutEnabled: true,
	})
}

// demo makes a decision every 25ms, for 3 users in turn, until ctx is done:
// about 13 requests per second per user, for a limit of 5 and a 1s block.
func demo(ctx context.Context, rdb redis.UniversalClient, m *metrics) error {
	lim, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(5), append(m.options("demo"),
		redlimit.WithPrefix("prometheus-demo"), redlimit.WithBlock(time.Second), redlimit.WithDenyCache(10_000))...)
	if err != nil {
		return err
	}
	defer lim.Close()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if _, err := lim.Allow(ctx, "user:"+strconv.Itoa(i%3)); err != nil && ctx.Err() == nil {
			return err
		}
	}
}

// selfTest makes the decisions of traffic, fetches url (the /metrics
// endpoint), prints the redlimit_ series to w and checks them.
func selfTest(ctx context.Context, rdb redis.UniversalClient, mr *miniredis.Miniredis, m *metrics, url string, w io.Writer) error {
	made, err := traffic(ctx, rdb, mr, m)
	if err != nil {
		return err
	}
	lines, samples, err := scrape(ctx, url)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%d decisions made: %d allowed, %d denied, %d shadowed, %d degraded; %s says:\n\n",
		made.decisions, made.allowed, made.denied, made.shadowed, made.degraded, url)
	buckets := 0
	for _, l := range lines {
		if strings.HasPrefix(l, "redlimit_decision_seconds_bucket") {
			buckets++
			continue
		}
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "(and %d redlimit_decision_seconds_bucket lines)\n\n", buckets)
	if err := check(samples, made, mr != nil); err != nil {
		return err
	}
	fmt.Fprintln(w, "selftest: ok, the metrics match the decisions")
	return nil
}

// tally counts what the callers were told, to check the metrics against.
type tally struct {
	decisions, allowed, denied, shadowed, degraded int
}

func (t *tally) add(res redlimit.Result) {
	t.decisions++
	switch {
	case res.Shadowed:
		t.shadowed++
	case res.Allowed:
		t.allowed++
	default:
		t.denied++
	}
	if res.Degraded {
		t.degraded++
	}
}

// traffic makes 19 decisions, and 2 more during a short outage when mr (the
// embedded miniredis) is not nil:
//
//   - limiter a, 5 per second with a 1s penalty block and a deny cache:
//     8 calls for user:1, of which 5 are allowed, 1 denied by the limit
//     (which starts the block) and 2 by the deny cache;
//   - limiter b, the same limit in another instance (no deny cache): 2
//     calls for user:1, denied by the block that a set in Redis;
//   - a: 3 calls for user:2, allowed;
//   - a candidate limit of 2 per second in shadow mode: 4 calls for user:3,
//     2 allowed and 2 shadowed;
//   - a leaky bucket of 2 per second: a call that takes the free slot, and
//     a Wait with 50ms to spare, denied at once by the deadline;
//   - a while Redis is down: 2 calls for user:4, allowed by the fallback.
func traffic(ctx context.Context, rdb redis.UniversalClient, mr *miniredis.Miniredis, m *metrics) (tally, error) {
	var t tally
	up := make(chan struct{}, 8)
	l, err := newTrafficLimiters(rdb, m, up)
	defer l.close()
	if err != nil {
		return t, err
	}
	if err := l.reset(ctx); err != nil {
		return t, err
	}
	a, b, shadow, queue := l.a, l.b, l.shadow, l.queue

	allow := func(lim *redlimit.RateLimiter, key string, times int) error {
		for range times {
			res, err := lim.Allow(ctx, key)
			if err != nil {
				return err
			}
			t.add(res)
		}
		return nil
	}
	for _, step := range []struct {
		lim   *redlimit.RateLimiter
		key   string
		times int
	}{{a, "user:1", 8}, {b, "user:1", 2}, {a, "user:2", 3}, {shadow, "user:3", 4}, {queue, "job", 1}} {
		if err := allow(step.lim, step.key, step.times); err != nil {
			return t, err
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = queue.Wait(waitCtx, "job")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		return t, fmt.Errorf("selftest: Wait with 50ms to spare for a slot 500ms away: got %v, want a deadline error", err)
	}
	t.add(redlimit.Result{}) // one decision, denied

	if mr == nil {
		return t, nil // a real Redis is not ours to stop
	}
	mr.Close() // an outage: a switches to its fallback
	if err := allow(a, "user:4", 2); err != nil {
		return t, err
	}
	if err := mr.Restart(); err != nil {
		return t, err
	}
	err = waitUp(ctx, up)
	return t, err
}

// trafficLimiters are the limiters of traffic.
type trafficLimiters struct {
	a, b, shadow, queue *redlimit.RateLimiter
	all                 []*redlimit.RateLimiter
}

// newTrafficLimiters makes the limiters of traffic, each with the metrics
// of its name, each sending on up when it is back on Redis after an
// outage. The caller closes them, also after an error.
func newTrafficLimiters(rdb redis.UniversalClient, m *metrics, up chan<- struct{}) (*trafficLimiters, error) {
	isUp := func(tr redlimit.Transition) {
		if !tr.Down && tr.Evicted == 0 {
			select { // say that a limiter is back on Redis
			case up <- struct{}{}:
			default:
			}
		}
	}
	l := &trafficLimiters{}
	var newErr error
	newLim := func(name string, newFn func(redis.UniversalClient, redlimit.Limit, ...redlimit.Option) (*redlimit.RateLimiter, error), limit redlimit.Limit, opts ...redlimit.Option) *redlimit.RateLimiter {
		options := []redlimit.Option{
			redlimit.WithPrefix("prometheus-selftest"),
			redlimit.WithObserver(m.c.Observer(name)),
			redlimit.WithOnTransition(m.transition(name, isUp)),
		}
		lim, err := newFn(rdb, limit, append(options, opts...)...)
		if err != nil {
			newErr = errors.Join(newErr, err)
			return nil
		}
		l.all = append(l.all, lim)
		return lim
	}
	l.a = newLim("api", redlimit.NewTokenBucket, redlimit.PerSecond(5), redlimit.WithBlock(time.Second), redlimit.WithDenyCache(1000))
	l.b = newLim("api-b", redlimit.NewTokenBucket, redlimit.PerSecond(5), redlimit.WithBlock(time.Second))
	l.shadow = newLim("candidate", redlimit.NewTokenBucket, redlimit.PerSecond(2), redlimit.WithPrefix("prometheus-candidate"), redlimit.WithShadow())
	l.queue = newLim("queue", redlimit.NewLeakyBucket, redlimit.Limit{Rate: 2, Period: time.Second, Burst: 3})
	return l, newErr
}

// reset resets the keys of traffic: it starts fresh on a real Redis.
func (l *trafficLimiters) reset(ctx context.Context) error {
	for _, reset := range []struct {
		lim *redlimit.RateLimiter
		key string
	}{{l.a, "user:1"}, {l.a, "user:2"}, {l.a, "user:4"}, {l.shadow, "user:3"}, {l.queue, "job"}} {
		if err := reset.lim.Reset(ctx, reset.key); err != nil {
			return err
		}
	}
	return nil
}

// close closes the limiters.
func (l *trafficLimiters) close() {
	for _, lim := range l.all {
		lim.Close()
	}
}

// waitUp waits until the 4 limiters of traffic are back on Redis after an
// outage. a probes Redis every 100ms and goes back after 2 good probes;
// the switch back is told to each of the 4 limiters that share the
// client's watch of its node (all of them: one client, one clock), each
// hook from a goroutine of its own: it waits for all 4.
func waitUp(ctx context.Context, up <-chan struct{}) error {
	timeout := time.After(5 * time.Second)
	for range 4 {
		select {
		case <-up:
		case <-timeout:
			return errors.New("selftest: not back on Redis 5s after the outage")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// scrape fetches url and returns its redlimit_ lines, and their values by
// series (name and labels, as written).
func scrape(ctx context.Context, url string) ([]string, map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("selftest: GET %s: %s", url, resp.Status)
	}
	var lines []string
	samples := make(map[string]float64)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "redlimit_") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if i < 0 || err != nil {
			return nil, nil, fmt.Errorf("selftest: bad line %q", l)
		}
		lines = append(lines, l)
		samples[l[:i]] = v
	}
	return lines, samples, sc.Err()
}

// sum adds the values of the series of metric name whose labels include
// every one of labels (written as in the exposition: `result="allowed"`).
func sum(samples map[string]float64, name string, labels ...string) float64 {
	total := 0.0
next:
	for series, v := range samples {
		if series != name && !strings.HasPrefix(series, name+"{") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(series, l) {
				continue next
			}
		}
		total += v
	}
	return total
}

// check compares the scraped samples with the decisions made.
func check(samples map[string]float64, made tally, outage bool) error {
	var errs []error
	want := func(what string, got, want float64) {
		if got != want {
			errs = append(errs, fmt.Errorf("%s = %v, want %v", what, got, want))
		}
	}
	atLeast1 := func(what string, got float64) {
		if got < 1 {
			errs = append(errs, fmt.Errorf("%s = %v, want at least 1", what, got))
		}
	}
	want("redlimit_decisions_total", sum(samples, "redlimit_decisions_total"), float64(made.decisions))
	for outcome, n := range map[string]int{"allowed": made.allowed + made.shadowed, "denied": made.denied, "error": 0} {
		want(`redlimit_decisions_total{outcome="`+outcome+`"}`, sum(samples, "redlimit_decisions_total", `outcome="`+outcome+`"`), float64(n))
	}
	want(`redlimit_decisions_total{shadowed="true"}`, sum(samples, "redlimit_decisions_total", `shadowed="true"`), float64(made.shadowed))
	want(`redlimit_decisions_total{denied_by!=""}`, float64(made.decisions)-sum(samples, "redlimit_decisions_total", `denied_by=""`), float64(made.denied+made.shadowed))
	for _, by := range []string{"limit", "block", "deny-cache", "deadline"} {
		atLeast1(`redlimit_decisions_total{denied_by="`+by+`"}`, sum(samples, "redlimit_decisions_total", `denied_by="`+by+`"`))
	}
	want("redlimit_decision_seconds_count", sum(samples, "redlimit_decision_seconds_count"), float64(made.decisions))
	want(`redlimit_decisions_total{degraded="true"}`, sum(samples, "redlimit_decisions_total", `degraded="true"`), float64(made.degraded))
	if outage {
		atLeast1("degraded decisions", float64(made.degraded))
		// One switch each way, reported by each of the four limiters,
		// which share the client's watch of its node (one client, one
		// clock; the shadow candidate's prefix does not matter).
		want(`redlimit_fallback_transitions_total{to="fallback"}`, sum(samples, "redlimit_fallback_transitions_total", `to="fallback"`), 4)
		want(`redlimit_fallback_transitions_total{to="redis"}`, sum(samples, "redlimit_fallback_transitions_total", `to="redis"`), 4)
		want("redlimit_fallback_active", sum(samples, "redlimit_fallback_active"), 0)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("selftest: the metrics do not match the decisions:\n%w", err)
	}
	return nil
}
