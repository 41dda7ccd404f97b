package grpclimit_test

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/redlimit/redlimit/grpclimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

func TestPeerKey(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 50051}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 50051}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 50051}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::1"), Port: 1, Zone: "eth0"}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 50051}, "::/64"},
		{&net.UDPAddr{IP: net.ParseIP("198.51.100.7"), Port: 443}, "198.51.100.7"},
		{&net.UnixAddr{Name: "/run/app.sock", Net: "unix"}, "unix:/run/app.sock"},
		{stringAddr("203.0.113.9:8080"), "203.0.113.9"},
		{stringAddr("[2001:db8::1]:8080"), "2001:db8::/64"},
		{stringAddr("203.0.113.9"), "203.0.113.9"},
		{stringAddr("pipe"), "test:pipe"},
	} {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tt.addr})
		got, err := grpclimit.PeerKey(ctx, "/svc/M")
		if !assert.NoError(t, err, "PeerKey(%v)", tt.addr) {
			continue
		}
		assert.Equal(t, tt.want, got, "PeerKey(%v) = %q, want %q", tt.addr, got, tt.want)
	}
}

func TestPeerKeyNoPeer(t *testing.T) {
	t.Parallel()
	_, err := grpclimit.PeerKey(context.Background(), "/svc/M")
	assert.ErrorIs(t, err, grpclimit.ErrNoKey, "got error %v, want one wrapping ErrNoKey", err)
}

func TestMetadataKeyValues(t *testing.T) {
	t.Parallel()
	key := grpclimit.MetadataKey("X-Api-Key")
	for _, tt := range []struct {
		md      metadata.MD
		want    string
		wantErr bool
	}{
		{metadata.Pairs("x-api-key", "k1"), "k1", false},
		{metadata.Pairs("X-API-KEY", "k1"), "k1", false},
		{metadata.Pairs("x-api-key", "", "x-api-key", "k2"), "k2", false},
		{metadata.Pairs("x-api-key", "k1", "x-api-key", "k2"), "k1", false},
		{metadata.Pairs("x-api-key", ""), "", true},
		{metadata.Pairs("authorization", "k1"), "", true},
		{nil, "", true},
	} {
		ctx := context.Background()
		if tt.md != nil {
			ctx = metadata.NewIncomingContext(ctx, tt.md)
		}
		got, err := key(ctx, "/svc/M")
		if tt.wantErr {
			assert.ErrorIs(t, err, grpclimit.ErrNoKey, "%v: got (%q, %v), want an error wrapping ErrNoKey", tt.md, got, err)
			continue
		}
		if assert.NoError(t, err, "%v: got (%q, %v), want %q", tt.md, got, err, tt.want) {
			assert.Equal(t, tt.want, got, "%v: got (%q, %v), want %q", tt.md, got, err, tt.want)
		}
	}
}

// stringAddr is a net.Addr of network "test" that is only a string.
type stringAddr string

func (a stringAddr) Network() string { return "test" }
func (a stringAddr) String() string  { return string(a) }

// TestIPKeyForgedMetadata sends calls whose client (203.0.113.7) forges
// forwarding metadata naming a victim (198.51.100.x). Every call must be
// keyed by the true client or, when the configured entry is missing or
// unusable, by the peer.
func TestIPKeyForgedMetadata(t *testing.T) {
	t.Parallel()
	const client = "203.0.113.7"
	proxy := &net.TCPAddr{IP: net.ParseIP("10.0.0.2"), Port: 40000}
	direct := &net.TCPAddr{IP: net.ParseIP(client), Port: 5555}
	proxies := httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))
	realIP := []httplimit.IPOption{proxies, httplimit.WithRealIPHeader("X-Real-IP")}
	xff1 := []httplimit.IPOption{proxies, httplimit.WithXForwardedFor(1)}
	xff2 := []httplimit.IPOption{proxies, httplimit.WithXForwardedFor(2)}
	for _, tt := range []struct {
		name string
		opts []httplimit.IPOption
		addr net.Addr
		md   metadata.MD
		want string
	}{
		{"no options: metadata ignored", nil, direct,
			metadata.Pairs("x-forwarded-for", "198.51.100.1", "x-real-ip", "198.51.100.2"), client},
		{"no options, from a proxy: the proxy", nil, proxy,
			metadata.Pairs("x-forwarded-for", client), "10.0.0.2"},
		{"X-Real-IP: client XFF ignored", realIP, proxy,
			metadata.Pairs("x-forwarded-for", "198.51.100.1", "x-real-ip", client), client},
		{"X-Real-IP: name in any case", realIP, proxy,
			metadata.Pairs("X-Real-IP", client), client},
		{"X-Real-IP with port", realIP, proxy,
			metadata.Pairs("x-real-ip", client+":5555"), client},
		{"X-Real-IP missing: peer, not XFF", realIP, proxy,
			metadata.Pairs("x-forwarded-for", "198.51.100.1"), "10.0.0.2"},
		{"X-Real-IP twice: peer", realIP, proxy,
			metadata.Pairs("x-real-ip", "198.51.100.1", "x-real-ip", client), "10.0.0.2"},
		{"X-Real-IP garbage: peer", realIP, proxy,
			metadata.Pairs("x-real-ip", "garbage"), "10.0.0.2"},
		{"X-Real-IP from an untrusted peer", realIP, direct,
			metadata.Pairs("x-real-ip", "198.51.100.1"), client},
		{"XFF: victim first", xff1, proxy,
			metadata.Pairs("x-forwarded-for", "198.51.100.1, "+client), client},
		{"XFF: values joined in order", xff1, proxy,
			metadata.Pairs("x-forwarded-for", "198.51.100.1", "X-Forwarded-For", " ,198.51.100.2, "+client+" ,"), client},
		{"XFF: IPv6 with port, zone", xff1, proxy,
			metadata.Pairs("x-forwarded-for", "198.51.100.1, [2001:db8:1:2::7%eth0]:443"), "2001:db8:1:2::/64"},
		{"XFF: X-Real-IP not read", xff1, proxy,
			metadata.Pairs("x-real-ip", "198.51.100.1"), "10.0.0.2"},
		{"XFF: garbage proxy entry: peer", xff1, proxy,
			metadata.Pairs("x-forwarded-for", "198.51.100.1, garbage"), "10.0.0.2"},
		{"XFF: two hops", xff2, proxy,
			metadata.Pairs("x-forwarded-for", "198.51.100.1, "+client+", 192.0.2.200"), client},
		{"XFF: too few hops: peer", xff2, proxy,
			metadata.Pairs("x-forwarded-for", client), "10.0.0.2"},
		{"XFF from an untrusted peer", xff1, direct,
			metadata.Pairs("x-forwarded-for", "198.51.100.1"), client},
		{"no metadata: peer", xff1, proxy, nil, "10.0.0.2"},
		{"IPv4-mapped proxy", xff1, &net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.2"), Port: 1},
			metadata.Pairs("x-forwarded-for", client), client},
		{"Unix socket peer: as PeerKey", xff1, &net.UnixAddr{Name: "/run/app.sock", Net: "unix"},
			metadata.Pairs("x-forwarded-for", "198.51.100.1"), "unix:/run/app.sock"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: tt.addr})
			if tt.md != nil {
				ctx = metadata.NewIncomingContext(ctx, tt.md)
			}
			got, err := grpclimit.IPKey(tt.opts...)(ctx, "/svc/M")
			require.NoError(t, err)
			assert.Equal(t, tt.want, got, "key of %v from %v", tt.md, tt.addr)
		})
	}
}

func TestIPKeyNoPeer(t *testing.T) {
	t.Parallel()
	_, err := grpclimit.IPKey()(context.Background(), "/svc/M")
	assert.ErrorIs(t, err, grpclimit.ErrNoKey)
}

func TestIPKeyPanics(t *testing.T) {
	t.Parallel()
	assert.Panics(t, func() { grpclimit.IPKey(httplimit.WithXForwardedFor(1)) }, "a header without trusted proxies")
}
