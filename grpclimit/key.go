package grpclimit

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// KeyFunc returns the rate-limit key of a call to fullMethod, such as
// "/grpc.health.v1.Health/Check". Calls with the same key share one limit.
//
// When it returns an error (or an empty key), the call fails without
// reaching the limiter: with the error's own code and message if it is a
// gRPC status error (made with status.Error, or wrapping one); with
// codes.InvalidArgument and the error's message if it wraps [ErrNoKey] (or
// the key is empty); and otherwise with codes.Internal and a fixed message.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// PeerKey is the default KeyFunc. It keys calls by the address of the
// connection's peer (peer.FromContext), without the port:
//
//   - an IPv4 address as is, "192.0.2.1" (IPv4-mapped IPv6 included);
//   - an IPv6 address by its /64 prefix, "2001:db8:1:2::/64", since one
//     client usually holds a whole /64;
//   - any other address, such as a Unix socket's, as its network and
//     address, "unix:/run/app.sock"; every client of such a listener then
//     shares one key.
//
// It trusts no metadata: behind a proxy or load balancer every call has the
// proxy's address. Write a KeyFunc that reads what the proxy forwards if
// you trust it. PeerKey's error, when the context has no peer, wraps
// [ErrNoKey].
func PeerKey(ctx context.Context, _ string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", fmt.Errorf("grpclimit: no peer address: %w", ErrNoKey)
	}
	return addrKey(p.Addr), nil
}

// addrKey returns the key of one peer address; see PeerKey.
func addrKey(a net.Addr) string {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		s := a.String()
		if ap, err := netip.ParseAddrPort(s); err == nil {
			ip = ap.Addr()
		} else if x, err := netip.ParseAddr(s); err == nil {
			ip = x
		}
	}
	if !ip.IsValid() {
		return a.Network() + ":" + a.String()
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is4() {
		return ip.String()
	}
	return netip.PrefixFrom(ip, 64).Masked().String()
}

// MetadataKey returns a KeyFunc that keys calls by the first non-empty
// value of the request metadata called name, such as "x-api-key" (gRPC
// metadata names are case-insensitive). A call without it fails with
// codes.InvalidArgument, its error wrapping [ErrNoKey].
//
// The value is used as is, so it appears in Redis key names. If it is a
// secret, wrap the KeyFunc to hash it, and look keys up the same way.
func MetadataKey(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		for _, v := range md.Get(name) {
			if v != "" {
				return v, nil
			}
		}
		return "", fmt.Errorf("grpclimit: no %q metadata: %w", name, ErrNoKey)
	}
}
