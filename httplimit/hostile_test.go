package httplimit_test

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
)

// A request's cost comes from the client (a declared size, a maximum of
// tokens): one below 1 is the limiter's ErrInvalidArgument, one past the
// tokens rule's capacity its ErrExceedsLimit, both answered by the error
// handler (by default 503 and 413, the client's error), never by the
// handler, and neither takes anything.
func TestHostileCost(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	for _, c := range []struct {
		cost int
		want error
		code int // the default error handler's
	}{
		{0, redlimit.ErrInvalidArgument, http.StatusServiceUnavailable},
		{-1, redlimit.ErrInvalidArgument, http.StatusServiceUnavailable},
		{math.MinInt, redlimit.ErrInvalidArgument, http.StatusServiceUnavailable},
		{1001, redlimit.ErrExceedsLimit, http.StatusRequestEntityTooLarge},
		{redlimit.MaxRate + 1, redlimit.ErrExceedsLimit, http.StatusRequestEntityTooLarge},
		{math.MaxInt, redlimit.ErrExceedsLimit, http.StatusRequestEntityTooLarge},
	} {
		var got error
		mw := httplimit.Middleware(rig.p,
			httplimit.WithCost(func(*http.Request) int { return c.cost }),
			httplimit.WithKeyFunc(httplimit.HeaderKey("X-Tenant")))
		withErr := httplimit.Middleware(rig.p,
			httplimit.WithCost(func(*http.Request) int { return c.cost }),
			httplimit.WithKeyFunc(httplimit.HeaderKey("X-Tenant")),
			httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
				got = err
				w.WriteHeader(http.StatusBadRequest)
			}))
		ok := &okHandler{}
		r := costRequest(0)
		r.Header.Set("X-Tenant", "t")
		var rec *httptest.ResponseRecorder
		require.NotPanics(t, func() { rec = serve(mw, ok, r) }, "cost %d", c.cost)
		assert.Equal(t, c.code, rec.Code, "cost %d: the default error handler", c.cost)
		rec = serve(withErr, ok, r)
		assert.Equal(t, http.StatusBadRequest, rec.Code, "cost %d: WithErrorHandler's answer", c.cost)
		require.ErrorIs(t, got, c.want, "cost %d: %v", c.cost, got)
		assert.Zero(t, ok.calls, "cost %d: the handler ran", c.cost)
		assert.Equal(t, 0, rig.tokensUsed(t, "t"), "cost %d took tokens", c.cost)
	}
	// The tokens are all there: a request of the whole capacity passes.
	mw := httplimit.Middleware(rig.p, httplimit.WithCost(func(*http.Request) int { return 1000 }),
		httplimit.WithKeyFunc(httplimit.HeaderKey("X-Tenant")))
	r := costRequest(0)
	r.Header.Set("X-Tenant", "t")
	assert.Equal(t, http.StatusOK, serve(mw, &okHandler{}, r).Code)
	assert.Equal(t, 1000, rig.tokensUsed(t, "t"))
}

// What a handler reports: a negative cost counts as 0 (everything goes
// back); more than reserved is charged, past the capacity too (the key
// owes it); one the state cannot owe (past MaxRate) fails the settle,
// which WithOnSettleError sees with ErrExceedsLimit, and the reservation
// stands as taken.
func TestHostileReport(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	var (
		mu   sync.Mutex
		errs []error
	)
	for _, c := range []struct {
		report  int
		used    int   // the tokens held after the request
		settled error // what WithOnSettleError got
		next    int   // the status of the key's next request, of cost 1
	}{
		{-1, 0, nil, http.StatusOK},
		{math.MinInt, 0, nil, http.StatusOK},
		{1500, 1000, nil, http.StatusTooManyRequests}, // owes 500: Remaining stays 0
		{redlimit.MaxRate + 1, 300, redlimit.ErrExceedsLimit, http.StatusOK},
		{math.MaxInt, 300, redlimit.ErrExceedsLimit, http.StatusOK},
	} {
		errs = nil
		key := fmt.Sprint("report ", c.report)
		mw := httplimit.Middleware(rig.p, httplimit.WithCost(maxTokens),
			httplimit.WithKeyFunc(func(*http.Request) (string, error) { return key, nil }),
			httplimit.WithOnSettleError(func(_ *http.Request, err error) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}))
		h := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { httplimit.Report(r, c.report) })
		var rec *httptest.ResponseRecorder
		require.NotPanics(t, func() { rec = serve(mw, h, costRequest(300)) }, "report %d", c.report)
		require.Equal(t, http.StatusOK, rec.Code, "report %d", c.report)
		assert.Equal(t, c.used, rig.tokensUsed(t, key), "report %d: tokens held", c.report)
		mu.Lock()
		if c.settled == nil {
			assert.Empty(t, errs, "report %d", c.report)
		} else if assert.Len(t, errs, 1, "report %d", c.report) {
			assert.ErrorIs(t, errs[0], c.settled, "report %d: %v", c.report, errs[0])
		}
		mu.Unlock()
		next := serve(mw, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), costRequest(1))
		assert.Equal(t, c.next, next.Code, "report %d: the next request", c.report)
	}
}

// A Priority from a request outside Sheddable..Critical is decided as
// Normal: it neither escalates to Critical nor fails the request.
func TestHostilePriority(t *testing.T) {
	t.Parallel()
	lim := sharesLimiter(t)
	for _, p := range []redlimit.Priority{0, -1, redlimit.Critical + 1, math.MaxInt, math.MinInt} {
		mw := httplimit.Middleware(lim,
			httplimit.WithKeyFunc(func(*http.Request) (string, error) { return "k" + p.String(), nil }),
			httplimit.WithPriority(func(*http.Request) redlimit.Priority { return p }))
		passed := 0
		for range 10 {
			rec := serve(mw, &okHandler{}, httptest.NewRequest(http.MethodGet, "/", nil))
			if rec.Code == http.StatusOK {
				passed++
			} else {
				require.Equal(t, http.StatusTooManyRequests, rec.Code, "priority %d", int(p))
			}
		}
		assert.Equal(t, 8, passed, "priority %d: the Normal share of 10", int(p))
	}
}

// sharesLimiter is a fixed window of 10 a minute with shares 0.5 and 0.8.
func sharesLimiter(t *testing.T) redlimit.Limiter {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerMinute(10), redlimit.WithPriorityShares(0.5, 0.8))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	return lim
}

// FuzzIPKeyer: the client address headers come from anyone. Behind a
// trusted proxy a key is always an IP address (never empty, never the
// header's text); from an untrusted peer the headers change nothing; the
// only error is a RemoteAddr that is not an address, and it does not wrap
// ErrNoKey.
func FuzzIPKeyer(f *testing.F) {
	for _, s := range [][3]string{
		{"10.0.0.1:1234", "192.0.2.1, 198.51.100.2", `for=192.0.2.1;proto=https, for="[2001:db8::1]:443"`},
		{"10.0.0.1", "", ""},
		{"[::ffff:10.0.0.1]:80", "::ffff:192.0.2.1", `for=unknown`},
		{"192.0.2.9:1", "203.0.113.5", "for=203.0.113.5"},
		{"10.1.2.3:9", ",,, ,\t", `for="\"";for=1.2.3.4`},
		{"10.1.2.3:9", "[fe80::1%eth0]:1", `FOR="[fe80::1%25eth0]"`},
		{"@", "1.2.3.4", "for=1.2.3.4"},
		{"10.0.0.1:1", strings.Repeat("1", 600), "for=" + strings.Repeat("a", 600)},
		{"10.0.0.1:1", "1.2.3.4\x00", "for=\x001.2.3.4"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	trusted := netip.MustParsePrefix("10.0.0.0/8")
	keyers := []*httplimit.IPKeyer{
		httplimit.NewIPKeyer(httplimit.WithTrustedProxies(trusted), httplimit.WithXForwardedFor(1)),
		httplimit.NewIPKeyer(httplimit.WithTrustedProxies(trusted), httplimit.WithXForwardedFor(2)),
		httplimit.NewIPKeyer(httplimit.WithTrustedProxies(trusted), httplimit.WithForwarded(1),
			httplimit.WithIPv6PrefixLen(128)),
		httplimit.NewIPKeyer(httplimit.WithTrustedProxies(trusted), httplimit.WithRealIPHeader("X-Forwarded-For")),
	}
	peerOnly := httplimit.NewIPKeyer(httplimit.WithIPv6PrefixLen(128))
	f.Fuzz(func(t *testing.T, remote, xff, fwd string) {
		header := func(name string) []string {
			switch name {
			case "X-Forwarded-For":
				return strings.Split(xff, "\n")
			case "Forwarded":
				return strings.Split(fwd, "\n")
			}
			return nil
		}
		peerKey, peerErr := peerOnly.Key(remote, nil)
		for i, k := range keyers {
			key, err := k.Key(remote, header)
			if peerErr != nil {
				require.Error(t, err, "keyer %d: RemoteAddr %q is not an address", i, remote)
				require.False(t, errors.Is(err, httplimit.ErrNoKey), "keyer %d: %v", i, err)
				continue
			}
			require.NoError(t, err, "keyer %d", i)
			_, addrErr := netip.ParseAddr(key)
			_, prefixErr := netip.ParsePrefix(key)
			require.True(t, addrErr == nil || prefixErr == nil, "keyer %d: key %q is not an address or a network", i, key)
			if !trusted.Contains(netip.MustParseAddr(peerKey)) {
				own, err := k.Key(remote, nil)
				require.NoError(t, err)
				require.Equal(t, own, key, "keyer %d: an untrusted peer's headers changed the key", i)
			}
		}
	})
}
