package grpclimit_test

import (
	"context"
	"net"
	"testing"

	"github.com/redlimit/redlimit/grpclimit"
	"github.com/stretchr/testify/assert"
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
