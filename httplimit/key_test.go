package httplimit_test

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/httplimit"
)

// request builds a GET request from remote with the given header lines
// (name, value pairs; a name may repeat).
func request(remote string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

func TestIPKey(t *testing.T) {
	t.Parallel()
	trusted := httplimit.WithTrustedProxies(
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("2001:db8:ffff::/48"),
	)
	const xff, xri = "X-Forwarded-For", "X-Real-IP"
	xff1 := []httplimit.IPOption{trusted, httplimit.WithXForwardedFor(1)}
	xff2 := []httplimit.IPOption{trusted, httplimit.WithXForwardedFor(2)}
	realIP := []httplimit.IPOption{trusted, httplimit.WithRealIPHeader("x-real-ip")}
	tests := []struct {
		name string
		opts []httplimit.IPOption
		r    *http.Request
		want string
	}{
		{"peer", nil, request("192.0.2.1:1234"), "192.0.2.1"},
		{"peer without port", nil, request("192.0.2.1"), "192.0.2.1"},
		{"no trusted proxies: XFF ignored", nil, request("10.0.0.1:1234", xff, "203.0.113.9"), "10.0.0.1"},
		{"spoofed XFF from untrusted peer", xff1,
			request("192.0.2.1:1234", xff, "203.0.113.9"), "192.0.2.1"},
		{"spoofed X-Real-IP from untrusted peer", realIP,
			request("192.0.2.1:1234", xri, "203.0.113.9"), "192.0.2.1"},
		{"XFF from trusted proxy", xff1,
			request("10.0.0.1:1234", xff, "203.0.113.9"), "203.0.113.9"},
		{"XFF two hops from the right, client spoof ignored", xff2,
			request("10.0.0.1:1234", xff, "198.51.100.7, 203.0.113.9, 10.0.0.2"), "203.0.113.9"},
		{"XFF over several lines", xff2,
			request("10.0.0.1:1234", xff, "198.51.100.7", xff, "203.0.113.9,10.0.0.2"), "203.0.113.9"},
		{"XFF empty entries skipped", xff2,
			request("10.0.0.1:1234", xff, "203.0.113.9, , 10.0.0.2,"), "203.0.113.9"},
		{"XFF hops count every entry, trusted or not", xff1,
			request("10.0.0.1:1234", xff, "10.1.1.1, 10.0.0.2"), "10.0.0.2"},
		{"XFF with ports", xff2,
			request("10.0.0.1:1234", xff, "203.0.113.9:5555, 10.0.0.2:80"), "203.0.113.9"},
		{"XFF IPv6 with port", xff1,
			request("10.0.0.1:1234", xff, "[2001:db8:1:2::9]:443"), "2001:db8:1:2::/64"},
		{"XFF malformed left of the hops: not read", xff1,
			request("10.0.0.1:1234", xff, "203.0.113.9, garbage, 10.0.0.2"), "10.0.0.2"},
		{"XFF malformed within the hops: peer", xff2,
			request("10.0.0.1:1234", xff, "203.0.113.9, garbage, 10.0.0.2"), "10.0.0.1"},
		{"XFF too few hops: peer", xff2,
			request("10.0.0.1:1234", xff, "203.0.113.9"), "10.0.0.1"},
		{"XFF malformed: peer, not X-Real-IP", xff1,
			request("10.0.0.1:1234", xff, "garbage", xri, "203.0.113.5"), "10.0.0.1"},
		{"XFF malformed, no X-Real-IP: peer", xff1,
			request("10.0.0.1:1234", xff, "garbage"), "10.0.0.1"},
		{"X-Real-IP from trusted proxy", realIP,
			request("10.0.0.1:1234", xri, " 203.0.113.5 "), "203.0.113.5"},
		{"XFF configured: X-Real-IP not read", xff1,
			request("10.0.0.1:1234", xri, "203.0.113.5", xff, "203.0.113.9"), "203.0.113.9"},
		{"X-Real-IP configured: XFF not read", realIP,
			request("10.0.0.1:1234", xri, "203.0.113.5", xff, "203.0.113.9"), "203.0.113.5"},
		{"X-Real-IP malformed: peer", realIP,
			request("10.0.0.1:1234", xri, "203.0.113.5, 203.0.113.6"), "10.0.0.1"},
		{"other single-value header", []httplimit.IPOption{trusted, httplimit.WithRealIPHeader("CF-Connecting-IP")},
			request("10.0.0.1:1234", xri, "203.0.113.5", "Cf-Connecting-Ip", "203.0.113.6"), "203.0.113.6"},
		{"trusted IPv6 proxy", xff1,
			request("[2001:db8:ffff::1]:443", xff, "2001:db8:aaaa:bbbb::1"), "2001:db8:aaaa:bbbb::/64"},
		{"trusted IPv4-mapped prefix", []httplimit.IPOption{httplimit.WithTrustedProxies(netip.MustParsePrefix("::ffff:10.0.0.0/104")), httplimit.WithXForwardedFor(1)},
			request("10.0.0.1:1234", xff, "203.0.113.9"), "203.0.113.9"},
		{"last header option wins", []httplimit.IPOption{trusted, httplimit.WithXForwardedFor(1), httplimit.WithRealIPHeader(xri)},
			request("10.0.0.1:1234", xri, "203.0.113.5", xff, "203.0.113.9"), "203.0.113.5"},
		{"IPv6 grouped by /64", nil, request("[2001:db8:1:2:3:4:5:6]:443"), "2001:db8:1:2::/64"},
		{"IPv6 zone dropped", nil, request("[fe80::1%eth0]:443"), "fe80::/64"},
		{"IPv4-mapped IPv6 is IPv4", nil, request("[::ffff:192.0.2.1]:443"), "192.0.2.1"},
		{"IPv6 /128", []httplimit.IPOption{httplimit.WithIPv6PrefixLen(128)},
			request("[2001:db8:1:2:3:4:5:6]:443"), "2001:db8:1:2:3:4:5:6"},
		{"IPv6 /48", []httplimit.IPOption{httplimit.WithIPv6PrefixLen(48)},
			request("[2001:db8:1:2:3:4:5:6]:443"), "2001:db8:1::/48"},
		{"IPv4 /24", []httplimit.IPOption{httplimit.WithIPv4PrefixLen(24)},
			request("192.0.2.77:1234"), "192.0.2.0/24"},
		{"forwarded IPv4 /24", []httplimit.IPOption{trusted, httplimit.WithXForwardedFor(1), httplimit.WithIPv4PrefixLen(24)},
			request("10.0.0.1:1234", xff, "203.0.113.9"), "203.0.113.0/24"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := httplimit.IPKey(tt.opts...)(tt.r)
			require.NoError(t, err, "key")
			assert.Equal(t, tt.want, got, "key = %q, want %q", got, tt.want)
		})
	}
}

func TestIPKeyBadRemoteAddr(t *testing.T) {
	t.Parallel()
	for _, remote := range []string{"", "@", "example.com:80", "192.0.2.1:"} {
		key, err := httplimit.IPKey()(request(remote))
		if !assert.Error(t, err, "RemoteAddr %q: key = %q, want an error", remote, key) {
			continue
		}
		assert.NotErrorIs(t, err, httplimit.ErrNoKey, "RemoteAddr %q: error %v wraps ErrNoKey, want a server error", remote, err)
	}
}

func TestHeaderKey(t *testing.T) {
	t.Parallel()
	key := httplimit.HeaderKey("x-api-key")
	got, err := key(request("192.0.2.1:1", "X-Api-Key", " secret-1 "))
	require.NoError(t, err)
	want := "secret-1"
	assert.Equal(t, want, got, "key = %q, want %q", got, want)
	for _, r := range []*http.Request{
		request("192.0.2.1:1"),
		request("192.0.2.1:1", "X-Api-Key", "  "),
	} {
		got, err := key(r)
		assert.ErrorIs(t, err, httplimit.ErrNoKey, "header %q: key = %q, err = %v, want ErrNoKey", r.Header.Get("X-Api-Key"), got, err)
	}
}

func TestKeyPanics(t *testing.T) {
	t.Parallel()
	for name, f := range map[string]func(){
		"HeaderKey empty":       func() { httplimit.HeaderKey("") },
		"IPv4 bits -1":          func() { httplimit.IPKey(httplimit.WithIPv4PrefixLen(-1)) },
		"IPv4 bits 33":          func() { httplimit.IPKey(httplimit.WithIPv4PrefixLen(33)) },
		"IPv6 bits 129":         func() { httplimit.IPKey(httplimit.WithIPv6PrefixLen(129)) },
		"invalid prefix":        func() { httplimit.IPKey(httplimit.WithTrustedProxies(netip.Prefix{}), httplimit.WithXForwardedFor(1)) },
		"proxies, no header":    func() { httplimit.IPKey(httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))) },
		"XFF, no proxies":       func() { httplimit.IPKey(httplimit.WithXForwardedFor(1)) },
		"X-Real-IP, no proxies": func() { httplimit.IPKey(httplimit.WithRealIPHeader("X-Real-IP")) },
		"Forwarded, no proxies": func() { httplimit.IPKey(httplimit.WithForwarded(1)) },
		"XFF 0 hops": func() {
			httplimit.IPKey(httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")), httplimit.WithXForwardedFor(0))
		},
		"Forwarded -1 hops": func() {
			httplimit.IPKey(httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")), httplimit.WithForwarded(-1))
		},
		"empty header name": func() {
			httplimit.IPKey(httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")), httplimit.WithRealIPHeader(""))
		},
		"header name with a space": func() {
			httplimit.IPKey(httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")), httplimit.WithRealIPHeader("X Real IP"))
		},
		"nil limiter":       func() { httplimit.Middleware(nil) },
		"nil key func":      func() { httplimit.Middleware(&fakeLimiter{}, httplimit.WithKeyFunc(nil)) },
		"nil denied":        func() { httplimit.Middleware(&fakeLimiter{}, httplimit.WithDeniedHandler(nil)) },
		"nil key error":     func() { httplimit.Middleware(&fakeLimiter{}, httplimit.WithKeyErrorHandler(nil)) },
		"nil error handler": func() { httplimit.Middleware(&fakeLimiter{}, httplimit.WithErrorHandler(nil)) },
		"policy not ASCII":  func() { httplimit.Middleware(&fakeLimiter{}, httplimit.WithPolicyName("é")) },
		"policy newline":    func() { httplimit.Middleware(&fakeLimiter{}, httplimit.WithPolicyName("a\nb")) },
	} {
		t.Run(name, func(t *testing.T) {
			assert.Panics(t, f, "no panic")
		})
	}
}

// wire parses a request from its header lines as the server does (names in
// any case, repeated lines kept in order), from peer remote.
func wire(t *testing.T, remote string, lines ...string) *http.Request {
	t.Helper()
	var b strings.Builder
	b.WriteString("GET / HTTP/1.1\r\nHost: api.example\r\n")
	for _, l := range lines {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("\r\n")
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(b.String())))
	require.NoError(t, err, "request %q", lines)
	r.RemoteAddr = remote
	return r
}

// TestIPKeyForgedHeaders sends requests whose client (203.0.113.7, or the
// 2001:db8:1:2::/64 network) forges forwarding headers, mostly naming a
// victim (198.51.100.x), through the deployments of the package
// documentation. Every request must be keyed by the true client, or, when
// the configured header is missing or unusable, by the peer: never by an
// address the client chose.
func TestIPKeyForgedHeaders(t *testing.T) {
	t.Parallel()
	const (
		client = "203.0.113.7"
		proxy  = "10.0.0.2:40000" // the peer behind a proxy
		peer   = "10.0.0.2"       // its key: the documented safe answer
		direct = "203.0.113.7:5555"
	)
	proxies := httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))
	deployments := map[string][]httplimit.IPOption{
		"no proxy":            nil,
		"nginx X-Real-IP":     {proxies, httplimit.WithRealIPHeader("X-Real-IP")},
		"nginx appending XFF": {proxies, httplimit.WithXForwardedFor(1)},
		"CDN and LB":          {proxies, httplimit.WithXForwardedFor(2)},
		"Forwarded":           {proxies, httplimit.WithForwarded(1)},
	}
	victims := strings.Repeat("198.51.100.1, ", 5000)
	noCommas := strings.Repeat("9", 100_000)
	tests := []struct {
		deployment string
		name       string
		remote     string
		lines      []string
		want       string
	}{
		// No proxy: no header is read.
		{"no proxy", "XFF", direct, []string{"X-Forwarded-For: 198.51.100.1"}, client},
		{"no proxy", "X-Real-IP", direct, []string{"X-Real-IP: 198.51.100.1"}, client},
		{"no proxy", "Forwarded", direct, []string{"Forwarded: for=198.51.100.1"}, client},
		{"no proxy", "all, lowercase", direct, []string{"x-forwarded-for: 198.51.100.1", "x-real-ip: 198.51.100.2", "true-client-ip: 198.51.100.3"}, client},

		// nginx, proxy_set_header X-Real-IP $remote_addr: the client's
		// X-Forwarded-For passes through unchanged.
		{"nginx X-Real-IP", "client XFF passed through (issue 10)", proxy, []string{"X-Forwarded-For: 198.51.100.1", "X-Real-IP: " + client}, client},
		{"nginx X-Real-IP", "XFF lines, any case", proxy, []string{"x-forwarded-for: 198.51.100.1", "X-FORWARDED-FOR: 198.51.100.2", "x-real-ip: " + client}, client},
		{"nginx X-Real-IP", "Forwarded passed through", proxy, []string{"Forwarded: for=198.51.100.1", "X-Real-IP: " + client}, client},
		{"nginx X-Real-IP", "spaces and tab", proxy, []string{"X-Real-IP: \t " + client + " \t"}, client},
		{"nginx X-Real-IP", "port", proxy, []string{"X-Real-IP: " + client + ":5555"}, client},
		{"nginx X-Real-IP", "IPv6 in brackets with port", proxy, []string{"X-Real-IP: [2001:db8:1:2::7]:443"}, "2001:db8:1:2::/64"},
		{"nginx X-Real-IP", "IPv6 in brackets", proxy, []string{"X-Real-IP: [2001:db8:1:2::7]"}, "2001:db8:1:2::/64"},
		{"nginx X-Real-IP", "IPv6 zone", proxy, []string{"X-Real-IP: fe80::1%eth0"}, "fe80::/64"},
		{"nginx X-Real-IP", "[::1]:80", proxy, []string{"X-Real-IP: [::1]:80"}, "::/64"},
		{"nginx X-Real-IP", "IPv4-mapped", proxy, []string{"X-Real-IP: ::ffff:" + client}, client},
		{"nginx X-Real-IP", "missing: peer, not XFF", proxy, []string{"X-Forwarded-For: 198.51.100.1"}, peer},
		{"nginx X-Real-IP", "two lines: peer", proxy, []string{"X-Real-IP: 198.51.100.1", "X-Real-IP: " + client}, peer},
		{"nginx X-Real-IP", "a list: peer", proxy, []string{"X-Real-IP: 198.51.100.1, " + client}, peer},
		{"nginx X-Real-IP", "empty: peer", proxy, []string{"X-Real-IP: ", "X-Forwarded-For: 198.51.100.1"}, peer},
		{"nginx X-Real-IP", "garbage: peer", proxy, []string{"X-Real-IP: <script>", "X-Forwarded-For: 198.51.100.1"}, peer},
		{"nginx X-Real-IP", "unknown: peer", proxy, []string{"X-Real-IP: unknown"}, peer},
		{"nginx X-Real-IP", "IPv4 in brackets: peer", proxy, []string{"X-Real-IP: [198.51.100.1]"}, peer},
		{"nginx X-Real-IP", "huge: peer", proxy, []string{"X-Real-IP: " + victims + client}, peer},
		{"nginx X-Real-IP", "huge zone: peer", proxy, []string{"X-Real-IP: fe80::1%" + noCommas}, peer},
		{"nginx X-Real-IP", "untrusted peer", direct, []string{"X-Real-IP: 198.51.100.1", "X-Forwarded-For: 198.51.100.2"}, client},

		// nginx, proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for:
		// the client's list, then the proxy's entry.
		{"nginx appending XFF", "victim first", proxy, []string{"X-Forwarded-For: 198.51.100.1, " + client}, client},
		{"nginx appending XFF", "X-Real-IP not read", proxy, []string{"X-Real-IP: 198.51.100.1", "X-Forwarded-For: " + client}, client},
		{"nginx appending XFF", "Forwarded not read", proxy, []string{"Forwarded: for=198.51.100.1", "X-Forwarded-For: " + client}, client},
		{"nginx appending XFF", "lines joined in order, any case", proxy, []string{"x-forwarded-for: 198.51.100.1", "X-FORWARDED-FOR: 198.51.100.2, " + client}, client},
		{"nginx appending XFF", "proxy entry on a line of its own", proxy, []string{"X-Forwarded-For: 198.51.100.1, 198.51.100.2", "x-Forwarded-for: " + client}, client},
		{"nginx appending XFF", "spaces, tabs, empty elements", proxy, []string{"X-Forwarded-For: ,198.51.100.1 ,, \t" + client + "\t, ,"}, client},
		{"nginx appending XFF", "empty line", proxy, []string{"X-Forwarded-For: 198.51.100.1", "X-Forwarded-For: " + client, "X-Forwarded-For: "}, client},
		{"nginx appending XFF", "ports", proxy, []string{"X-Forwarded-For: 198.51.100.1:80, " + client + ":5555"}, client},
		{"nginx appending XFF", "IPv6 in brackets with port", proxy, []string{"X-Forwarded-For: 198.51.100.1, [2001:db8:1:2::7]:443"}, "2001:db8:1:2::/64"},
		{"nginx appending XFF", "IPv6 zone", proxy, []string{"X-Forwarded-For: 198.51.100.1, fe80::1%eth0"}, "fe80::/64"},
		{"nginx appending XFF", "[::1]:80", proxy, []string{"X-Forwarded-For: 198.51.100.1, [::1]:80"}, "::/64"},
		{"nginx appending XFF", "IPv4-mapped", proxy, []string{"X-Forwarded-For: 198.51.100.1, ::ffff:" + client}, client},
		{"nginx appending XFF", "garbage left of the proxy entry", proxy, []string{`X-Forwarded-For: garbage, "quoted, 198.51.100.1", <x>, ` + client}, client},
		{"nginx appending XFF", "thousands of victims", proxy, []string{"X-Forwarded-For: " + victims + client}, client},
		{"nginx appending XFF", "100 KB without a comma", proxy, []string{"X-Forwarded-For: " + noCommas, "X-Forwarded-For: " + client}, client},
		{"nginx appending XFF", "garbage proxy entry: peer", proxy, []string{"X-Forwarded-For: 198.51.100.1, garbage"}, peer},
		{"nginx appending XFF", "port out of range: peer", proxy, []string{"X-Forwarded-For: 198.51.100.1, " + client + ":65536"}, peer},
		{"nginx appending XFF", "overlong proxy entry: peer", proxy, []string{"X-Forwarded-For: 198.51.100.1, fe80::1%" + noCommas}, peer},
		{"nginx appending XFF", "missing: peer, not X-Real-IP", proxy, []string{"X-Real-IP: 198.51.100.1"}, peer},
		{"nginx appending XFF", "only empty elements: peer", proxy, []string{"X-Forwarded-For: , ,"}, peer},
		{"nginx appending XFF", "untrusted peer", direct, []string{"X-Forwarded-For: 198.51.100.1"}, client},

		// A CDN in front of a cloud load balancer (one hop each, both
		// appending): the LB's entry is the CDN's address.
		{"CDN and LB", "victim first", proxy, []string{"X-Forwarded-For: 198.51.100.1, " + client + ", 192.0.2.200"}, client},
		{"CDN and LB", "lines", proxy, []string{"X-Forwarded-For: 198.51.100.1", "X-Forwarded-For: " + client, "X-Forwarded-For: 192.0.2.200"}, client},
		{"CDN and LB", "too few hops: peer", proxy, []string{"X-Forwarded-For: " + client}, peer},
		{"CDN and LB", "too few hops, empty elements: peer", proxy, []string{"X-Forwarded-For: , " + client + ", ,"}, peer},
		{"CDN and LB", "garbage LB entry: peer", proxy, []string{"X-Forwarded-For: 198.51.100.1, " + client + ", garbage"}, peer},

		// RFC 7239 Forwarded, appended by one proxy.
		{"Forwarded", "victim first", proxy, []string{"Forwarded: for=198.51.100.1", "Forwarded: for=" + client + ";proto=https"}, client},
		{"Forwarded", "one line, quoted IPv6 with port", proxy, []string{`Forwarded: for=198.51.100.1, for="[2001:db8:1:2::7]:4711"`}, "2001:db8:1:2::/64"},
		{"Forwarded", "quoted IPv4 with port", proxy, []string{`Forwarded: for="` + client + `:4711"`}, client},
		{"Forwarded", "unbalanced quote from the client", proxy, []string{`Forwarded: for="198.51.100.1, for=198.51.100.2`, "forwarded: for=" + client}, client},
		{"Forwarded", "names in any case", proxy, []string{"FORWARDED: by=10.0.0.2;FOR=" + client + ";Proto=http"}, client},
		{"Forwarded", "XFF not read", proxy, []string{"X-Forwarded-For: 198.51.100.1"}, peer},
		{"Forwarded", "unknown: peer", proxy, []string{"Forwarded: for=198.51.100.1, for=unknown"}, peer},
		{"Forwarded", "obfuscated: peer", proxy, []string{"Forwarded: for=198.51.100.1, for=_hidden"}, peer},
		{"Forwarded", "no for: peer", proxy, []string{"Forwarded: for=198.51.100.1, proto=https"}, peer},
		{"Forwarded", "two for: peer", proxy, []string{"Forwarded: for=198.51.100.1;for=" + client}, peer},
		{"Forwarded", "escaped quote: peer", proxy, []string{`Forwarded: for="198.51.100.1\"`}, peer},
		{"Forwarded", "untrusted peer", direct, []string{"Forwarded: for=198.51.100.1"}, client},
	}
	for _, tt := range tests {
		t.Run(tt.deployment+"/"+tt.name, func(t *testing.T) {
			opts, ok := deployments[tt.deployment]
			require.True(t, ok, "deployment %q", tt.deployment)
			got, err := httplimit.IPKey(opts...)(wire(t, tt.remote, tt.lines...))
			require.NoError(t, err, "key")
			assert.Equal(t, tt.want, got, "key of %q from %s", tt.lines, tt.remote)
		})
	}
}
