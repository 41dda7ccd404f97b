package grpclimit

import (
	"context"
	"net"
	"net/netip"
	"strings"

	"github.com/redlimit/redlimit/httplimit"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/redlimit/redlimit/internal/errprefix"
)

// KeyFunc returns the rate-limit key of a call to fullMethod, such as
// "/grpc.health.v1.Health/Check". Calls with the same key share one limit.
// fullMethod is the name the client sent, which on a server with a
// grpc.UnknownServiceHandler may be any name: do not put it in the key;
// [WithPerMethod] adds it only for registered methods.
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
// proxy's address; use [IPKey] there. PeerKey's error, when the context has
// no peer, wraps [ErrNoKey].
func PeerKey(ctx context.Context, _ string) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", errprefix.Errorf("grpclimit: ", "no peer address: %w", ErrNoKey)
	}
	return addrKey(p.Addr), nil
}

// IPKey returns a KeyFunc that keys calls by the client's IP address, as
// [PeerKey] does, and behind proxies by the one request metadata entry
// that they set, with the options and rules of httplimit.IPKey: the
// default reads no metadata; httplimit.WithRealIPHeader("x-real-ip")
// (nginx: grpc_set_header X-Real-IP $remote_addr),
// httplimit.WithXForwardedFor(hops) (Envoy and cloud load balancers append
// to x-forwarded-for) or httplimit.WithForwarded(hops) name the entry, and
// httplimit.WithTrustedProxies the peers it is read from. Metadata names
// are matched in lowercase, and the values of a repeated entry are joined
// in order. When the entry is missing or unusable, the key is the peer's
// address, never an address from other metadata or one the client chose:
//
//	grpclimit.WithKeyFunc(grpclimit.IPKey(
//		httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/16")),
//		httplimit.WithXForwardedFor(1),
//	))
//
// Peers that are not IP addresses (a Unix socket) are keyed as by PeerKey.
// The error, when the context has no peer, wraps [ErrNoKey]. IPKey panics
// on invalid options, as httplimit.IPKey does.
func IPKey(opts ...httplimit.IPOption) KeyFunc {
	k := httplimit.NewIPKeyer(opts...)
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", errprefix.Errorf("grpclimit: ", "no peer address: %w", ErrNoKey)
		}
		ip, ok := peerIP(p.Addr)
		if !ok {
			return addrKey(p.Addr), nil
		}
		md, _ := metadata.FromIncomingContext(ctx)
		return k.Key(ip.String(), md.Get)
	}
}

// addrKey returns the key of one peer address; see PeerKey.
func addrKey(a net.Addr) string {
	ip, ok := peerIP(a)
	if !ok {
		return a.Network() + ":" + a.String()
	}
	if ip.Is4() {
		return ip.String()
	}
	return netip.PrefixFrom(ip, 64).Masked().String()
}

// peerIP returns the IP address of a peer, unmapped and without a zone, and
// false if it has none.
func peerIP(a net.Addr) (netip.Addr, bool) {
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
		return netip.Addr{}, false
	}
	return ip.Unmap().WithZone(""), true
}

// MetadataKey returns a KeyFunc that keys calls by the first non-empty
// value of the request metadata called name, such as "x-api-key" (gRPC
// metadata names are case-insensitive). A call without it fails with
// codes.InvalidArgument, its error wrapping [ErrNoKey].
//
// The value is the client's to choose: use MetadataKey only where it has
// been checked before the limiter runs (an authenticating interceptor
// earlier in the chain, or your own KeyFunc that looks it up), or a client
// that sends a new value on every call gets a new limit each time, and
// adds a key to Redis each time. The value is used as is, so it appears in
// Redis key names. If it is a secret, wrap the KeyFunc to hash it, and
// look keys up the same way.
func MetadataKey(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		for _, v := range md.Get(name) {
			if v != "" {
				return v, nil
			}
		}
		return "", errprefix.Errorf("grpclimit: ", "no %q metadata: %w", name, ErrNoKey)
	}
}
