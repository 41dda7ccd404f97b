package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// KeyFunc returns the key that a request is limited by. It returns an error
// when the key cannot be found; wrap [ErrNoKey] when that is the client's
// fault (the default key error handler then answers 400 rather than 500).
// An empty key with a nil error counts as an error wrapping ErrNoKey.
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey is wrapped by the errors of key functions for a request that
// lacks what identifies its client, such as the header of [HeaderKey].
var ErrNoKey = errors.New("httplimit: no key in request")

var errEmptyKey = fmt.Errorf("httplimit: key function returned an empty key: %w", ErrNoKey)

// HeaderKey returns a KeyFunc whose key is the value of the request header
// name (its first value, with surrounding spaces trimmed), such as an API
// key. A missing or empty header is an error wrapping [ErrNoKey]. The value
// is used as is, so it is visible in Redis keys: hash it in your own
// KeyFunc if that matters. HeaderKey panics if name is empty.
func HeaderKey(name string) KeyFunc {
	if name == "" {
		panic("httplimit: HeaderKey: empty header name")
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if v == "" {
			return "", fmt.Errorf("httplimit: header %q is missing or empty: %w", name, ErrNoKey)
		}
		return v, nil
	}
}

// IPOption configures [IPKey].
type IPOption interface {
	applyIP(*ipConfig)
}

type ipOptionFunc func(*ipConfig)

func (f ipOptionFunc) applyIP(c *ipConfig) { f(c) }

type ipConfig struct {
	trusted []netip.Prefix
	v4Bits  int
	v6Bits  int
}

// WithTrustedProxies sets the networks of the reverse proxies whose
// X-Forwarded-For and X-Real-IP header fields are believed. Only these
// proxies may set the client address: the fields are read only when the
// request comes straight from one of them (its RemoteAddr is inside a
// prefix), and the proxies must append to X-Forwarded-For, or overwrite
// X-Real-IP, rather than pass on what the client sent. IPv4-mapped IPv6
// prefixes (::ffff:10.0.0.0/104) count as IPv4. The default is none: the
// forwarding fields are ignored. IPKey panics on an invalid prefix.
func WithTrustedProxies(prefixes ...netip.Prefix) IPOption {
	p := append([]netip.Prefix(nil), prefixes...)
	return ipOptionFunc(func(c *ipConfig) { c.trusted = append(c.trusted, p...) })
}

// WithIPv4PrefixLen sets how many leading bits of an IPv4 address make the
// key: addresses in one such network share a limit. The default is 32, one
// key per address. IPKey panics if bits is not in [0, 32].
func WithIPv4PrefixLen(bits int) IPOption {
	return ipOptionFunc(func(c *ipConfig) { c.v4Bits = bits })
}

// WithIPv6PrefixLen sets how many leading bits of an IPv6 address make the
// key: addresses in one such network share a limit. The default is 64,
// since a single host or customer usually gets a whole /64 and can pick any
// address in it. IPKey panics if bits is not in [0, 128].
func WithIPv6PrefixLen(bits int) IPOption {
	return ipOptionFunc(func(c *ipConfig) { c.v6Bits = bits })
}

// IPKey returns a KeyFunc whose key is the client's IP address, or its
// network: IPv4 addresses whole (/32) and IPv6 addresses grouped by /64 by
// default (see [WithIPv4PrefixLen], [WithIPv6PrefixLen]). IPv4-mapped IPv6
// addresses count as IPv4, and zones are dropped. The key is the address
// ("192.0.2.1") when the prefix length is the whole address, and the
// masked network ("2001:db8:1:2::/64") otherwise.
//
// The client is the peer of the connection, from Request.RemoteAddr. Only
// when that peer is a trusted proxy ([WithTrustedProxies]) are the
// forwarding fields read:
//
//   - X-Forwarded-For (all its lines, as one comma-separated list) is
//     walked from the right, skipping trusted proxies; the first address
//     that is not trusted is the client. If every address is trusted, the
//     leftmost is used. A malformed entry ends the walk: the last trusted
//     address seen is used, or, if there is none, the next field.
//   - Otherwise X-Real-IP, when it holds one valid address.
//   - Otherwise the peer itself.
//
// Without trusted proxies, which is the default, those fields are ignored,
// since any client can write them. The KeyFunc fails (with an error that
// does not wrap ErrNoKey, so 500 by default) only when RemoteAddr is not an
// IP address, as with a Unix socket listener.
func IPKey(opts ...IPOption) KeyFunc {
	cfg := ipConfig{v4Bits: 32, v6Bits: 64}
	for _, o := range opts {
		o.applyIP(&cfg)
	}
	if cfg.v4Bits < 0 || cfg.v4Bits > 32 {
		panic(fmt.Sprintf("httplimit: IPv4 prefix length %d not in [0, 32]", cfg.v4Bits))
	}
	if cfg.v6Bits < 0 || cfg.v6Bits > 128 {
		panic(fmt.Sprintf("httplimit: IPv6 prefix length %d not in [0, 128]", cfg.v6Bits))
	}
	trusted := make([]netip.Prefix, 0, len(cfg.trusted))
	for _, p := range cfg.trusted {
		if !p.IsValid() {
			panic(fmt.Sprintf("httplimit: invalid trusted proxy prefix %v", p))
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		trusted = append(trusted, p.Masked())
	}
	k := &ipKeyer{trusted: trusted, v4Bits: cfg.v4Bits, v6Bits: cfg.v6Bits}
	return k.key
}

type ipKeyer struct {
	trusted []netip.Prefix
	v4Bits  int
	v6Bits  int
}

func (k *ipKeyer) key(r *http.Request) (string, error) {
	peer, ok := parseAddr(r.RemoteAddr)
	if !ok {
		return "", fmt.Errorf("httplimit: RemoteAddr %q is not an IP address", r.RemoteAddr)
	}
	addr := peer
	if k.isTrusted(peer) {
		if a, ok := k.forwardedFor(r.Header.Values("X-Forwarded-For")); ok {
			addr = a
		} else if a, ok := parseAddr(strings.TrimSpace(r.Header.Get("X-Real-IP"))); ok {
			addr = a
		}
	}
	return k.group(addr), nil
}

// forwardedFor walks X-Forwarded-For from the right and returns the first
// address that is not a trusted proxy.
func (k *ipKeyer) forwardedFor(lines []string) (netip.Addr, bool) {
	var last netip.Addr
	found := false
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for line != "" {
			var entry string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				entry, line = line, ""
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			a, ok := parseAddr(entry)
			if !ok {
				return last, found
			}
			if !k.isTrusted(a) {
				return a, true
			}
			last, found = a, true
		}
	}
	return last, found
}

func (k *ipKeyer) isTrusted(a netip.Addr) bool {
	for _, p := range k.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// group returns the key of a: the address, or its network.
func (k *ipKeyer) group(a netip.Addr) string {
	bits := k.v6Bits
	if a.Is4() {
		bits = k.v4Bits
	}
	if bits == a.BitLen() {
		return a.String()
	}
	p, _ := a.Prefix(bits) // bits is within [0, BitLen], checked by IPKey
	return p.String()
}

// parseAddr parses "ip", "ip:port" or "[ip]:port", dropping the zone and
// unmapping IPv4-mapped IPv6 addresses.
func parseAddr(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	}
	return a.WithZone("").Unmap(), true
}
