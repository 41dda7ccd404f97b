package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
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
	tests := []struct {
		name string
		opts []httplimit.IPOption
		r    *http.Request
		want string
	}{
		{"peer", nil, request("192.0.2.1:1234"), "192.0.2.1"},
		{"peer without port", nil, request("192.0.2.1"), "192.0.2.1"},
		{"no trusted proxies: XFF ignored", nil, request("10.0.0.1:1234", xff, "203.0.113.9"), "10.0.0.1"},
		{"spoofed XFF from untrusted peer", []httplimit.IPOption{trusted},
			request("192.0.2.1:1234", xff, "203.0.113.9"), "192.0.2.1"},
		{"spoofed X-Real-IP from untrusted peer", []httplimit.IPOption{trusted},
			request("192.0.2.1:1234", xri, "203.0.113.9"), "192.0.2.1"},
		{"XFF from trusted proxy", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "203.0.113.9"), "203.0.113.9"},
		{"XFF walked from the right, client spoof ignored", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "198.51.100.7, 203.0.113.9, 10.0.0.2"), "203.0.113.9"},
		{"XFF over several lines", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "198.51.100.7", xff, "203.0.113.9,10.0.0.2"), "203.0.113.9"},
		{"XFF empty entries skipped", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "203.0.113.9, , 10.0.0.2,"), "203.0.113.9"},
		{"XFF all trusted: leftmost", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "10.1.1.1, 10.0.0.2"), "10.1.1.1"},
		{"XFF with ports", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "203.0.113.9:5555, 10.0.0.2:80"), "203.0.113.9"},
		{"XFF IPv6 with port", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "[2001:db8:1:2::9]:443"), "2001:db8:1:2::/64"},
		{"XFF malformed after trusted: last trusted", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "203.0.113.9, garbage, 10.0.0.2"), "10.0.0.2"},
		{"XFF malformed: X-Real-IP", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "garbage", xri, "203.0.113.5"), "203.0.113.5"},
		{"XFF malformed, no X-Real-IP: peer", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xff, "garbage"), "10.0.0.1"},
		{"X-Real-IP from trusted proxy", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xri, " 203.0.113.5 "), "203.0.113.5"},
		{"XFF preferred to X-Real-IP", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xri, "203.0.113.5", xff, "203.0.113.9"), "203.0.113.9"},
		{"X-Real-IP malformed: peer", []httplimit.IPOption{trusted},
			request("10.0.0.1:1234", xri, "203.0.113.5, 203.0.113.6"), "10.0.0.1"},
		{"trusted IPv6 proxy", []httplimit.IPOption{trusted},
			request("[2001:db8:ffff::1]:443", xff, "2001:db8:aaaa:bbbb::1"), "2001:db8:aaaa:bbbb::/64"},
		{"trusted IPv4-mapped prefix", []httplimit.IPOption{httplimit.WithTrustedProxies(netip.MustParsePrefix("::ffff:10.0.0.0/104"))},
			request("10.0.0.1:1234", xff, "203.0.113.9"), "203.0.113.9"},
		{"IPv6 grouped by /64", nil, request("[2001:db8:1:2:3:4:5:6]:443"), "2001:db8:1:2::/64"},
		{"IPv6 zone dropped", nil, request("[fe80::1%eth0]:443"), "fe80::/64"},
		{"IPv4-mapped IPv6 is IPv4", nil, request("[::ffff:192.0.2.1]:443"), "192.0.2.1"},
		{"IPv6 /128", []httplimit.IPOption{httplimit.WithIPv6PrefixLen(128)},
			request("[2001:db8:1:2:3:4:5:6]:443"), "2001:db8:1:2:3:4:5:6"},
		{"IPv6 /48", []httplimit.IPOption{httplimit.WithIPv6PrefixLen(48)},
			request("[2001:db8:1:2:3:4:5:6]:443"), "2001:db8:1::/48"},
		{"IPv4 /24", []httplimit.IPOption{httplimit.WithIPv4PrefixLen(24)},
			request("192.0.2.77:1234"), "192.0.2.0/24"},
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
		"HeaderKey empty":   func() { httplimit.HeaderKey("") },
		"IPv4 bits -1":      func() { httplimit.IPKey(httplimit.WithIPv4PrefixLen(-1)) },
		"IPv4 bits 33":      func() { httplimit.IPKey(httplimit.WithIPv4PrefixLen(33)) },
		"IPv6 bits 129":     func() { httplimit.IPKey(httplimit.WithIPv6PrefixLen(129)) },
		"invalid prefix":    func() { httplimit.IPKey(httplimit.WithTrustedProxies(netip.Prefix{})) },
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
