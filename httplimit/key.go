package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/redlimit/redlimit/internal/errprefix"
)

// KeyFunc returns the key that a request is limited by. It returns an error
// when the key cannot be found; wrap [ErrNoKey] when that is the client's
// fault (the default key error handler then answers 400 rather than 500).
// An empty key with a nil error counts as an error wrapping ErrNoKey.
type KeyFunc func(*http.Request) (string, error)

// ErrNoKey is wrapped by the errors of key functions for a request that
// lacks what identifies its client, such as the header of [HeaderKey].
var ErrNoKey = errors.New("httplimit: no key in request")

var errEmptyKey = errprefix.Errorf("httplimit: ", "key function returned an empty key: %w", ErrNoKey)

// HeaderKey returns a KeyFunc whose key is the value of the request header
// name (its first value, with surrounding spaces trimmed), such as an API
// key. A missing or empty header is an error wrapping [ErrNoKey]. The value
// is the client's to choose: use HeaderKey only where it has been checked
// before the limiter runs (an authenticating middleware in front of it, or
// your own KeyFunc that looks it up), or a client that sends a new value on
// every request gets a new limit each time, and adds a key to Redis each
// time. The value is used as is, so it is visible in Redis keys: hash it in
// your own KeyFunc if that matters. HeaderKey panics if name is empty.
func HeaderKey(name string) KeyFunc {
	if name == "" {
		panic("httplimit: HeaderKey: empty header name")
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := strings.TrimSpace(r.Header.Get(name))
		if v == "" {
			return "", errprefix.Errorf("httplimit: ", "header %q is missing or empty: %w", name, ErrNoKey)
		}
		return v, nil
	}
}

// IPOption configures [IPKey] and [NewIPKeyer].
type IPOption interface {
	applyIP(*ipConfig)
}

type ipOptionFunc func(*ipConfig)

func (f ipOptionFunc) applyIP(c *ipConfig) { f(c) }

// ipSource says where the client address comes from.
type ipSource int8

const (
	fromPeer      ipSource = iota // RemoteAddr only
	fromSingle                    // one address in a header the proxy overwrites
	fromXFF                       // X-Forwarded-For, hops from the right
	fromForwarded                 // RFC 7239 Forwarded, hops from the right
)

type ipConfig struct {
	trusted []netip.Prefix
	source  ipSource
	header  string // the header of source, as given
	hops    int    // fromXFF, fromForwarded
	v4Bits  int
	v6Bits  int
}

// WithTrustedProxies sets the networks that the reverse proxies connect
// from. The header chosen with [WithRealIPHeader], [WithXForwardedFor] or
// [WithForwarded] is read only when the request's peer (RemoteAddr) is in
// one of them; a client that reaches the server directly is keyed by its
// own address whatever headers it sends. IPv4-mapped IPv6 prefixes
// (::ffff:10.0.0.0/104) count as IPv4. There is no default: a header needs
// trusted proxies, and trusted proxies need a header (IPKey panics
// otherwise, and on an invalid prefix). If the proxies' addresses are not
// known, 0.0.0.0/0 and ::/0 trust every peer: do that only when the server
// cannot be reached except through the proxies.
func WithTrustedProxies(prefixes ...netip.Prefix) IPOption {
	p := append([]netip.Prefix(nil), prefixes...)
	return ipOptionFunc(func(c *ipConfig) { c.trusted = append(c.trusted, p...) })
}

// WithRealIPHeader makes the client address the value of header name, a
// field that the trusted proxy overwrites with the address of its own peer,
// whatever the client sent: X-Real-IP (nginx: proxy_set_header X-Real-IP
// $remote_addr), CF-Connecting-IP (Cloudflare), True-Client-IP (Akamai,
// Cloudflare Enterprise) or Fly-Client-IP. The field must hold one address
// ("ip", "ip:port" or "[ip]:port") on one field line; anything else is
// unusable, and the request is keyed by its peer (see [IPKey]). Do not use
// it for a field that proxies append to, such as X-Forwarded-For: see
// [WithXForwardedFor]. It needs [WithTrustedProxies]; the last of
// WithRealIPHeader, WithXForwardedFor and WithForwarded wins. IPKey panics
// if name is not a valid header field name.
func WithRealIPHeader(name string) IPOption {
	return ipOptionFunc(func(c *ipConfig) { c.source, c.header, c.hops = fromSingle, name, 0 })
}

// WithXForwardedFor makes the client address the hops-th address from the
// right of X-Forwarded-For, for a chain of hops trusted proxies that each
// append the address of their peer to it (nginx: proxy_set_header
// X-Forwarded-For $proxy_add_x_forwarded_for; AWS ALB, GCP load balancers
// and most cloud load balancers do it themselves): 1 for one proxy, 2 for a
// CDN in front of a load balancer. The entries left of those are whatever
// the client sent, and are never read. All the field's lines count, joined
// in order into one list (RFC 9110, section 5.3); empty elements are
// skipped. When there are fewer than hops entries, or one of the hops
// rightmost is not an address ("ip", "ip:port" or "[ip]:port"), the field
// is unusable, and the request is keyed by its peer (see [IPKey]).
//
// Every request must pass through all hops proxies: one that can skip a
// proxy can put any address where that proxy's entry would be. It needs
// [WithTrustedProxies]; the last of WithRealIPHeader, WithXForwardedFor and
// WithForwarded wins. IPKey panics if hops < 1.
func WithXForwardedFor(hops int) IPOption {
	return ipOptionFunc(func(c *ipConfig) { c.source, c.header, c.hops = fromXFF, "X-Forwarded-For", hops })
}

// WithForwarded is [WithXForwardedFor] for the Forwarded field of RFC 7239,
// which proxies also append to: the client is the "for" parameter of the
// hops-th element from the right (for=192.0.2.60, or
// for="[2001:db8::17]:4711"). An element without exactly one "for", or
// whose node is not an address (for=unknown, or an obfuscated
// identifier such as for=_hidden), is unusable, and the request is keyed
// by its peer. It needs [WithTrustedProxies]; IPKey panics if hops < 1.
func WithForwarded(hops int) IPOption {
	return ipOptionFunc(func(c *ipConfig) { c.source, c.header, c.hops = fromForwarded, "Forwarded", hops })
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
// By default the client is the peer of the connection, from
// Request.RemoteAddr, and no header is read: any client can write any
// header. Behind reverse proxies, say which one header they set, and
// nothing else is read:
//
//   - [WithRealIPHeader]: a field the proxy overwrites, such as X-Real-IP;
//   - [WithXForwardedFor]: X-Forwarded-For, which the proxies append to,
//     with how many of them there are;
//   - [WithForwarded]: the same with the Forwarded field of RFC 7239;
//
// together with [WithTrustedProxies], the networks the proxies connect
// from. The header is read only from those peers. When it is missing or
// unusable (see each option), the key is the peer's address: that request
// did not come through the proxies as configured (a health check of the
// load balancer itself, or a misconfigured proxy), and the peer is the one
// address no client can forge. It is never an error, and never an address
// from another header.
//
// The package documentation has the options for common deployments.
//
// The KeyFunc fails (with an error that does not wrap ErrNoKey, so 500 by
// default) only when RemoteAddr is not an IP address, as with a Unix socket
// listener. IPKey panics on invalid options: a prefix length out of range,
// an invalid prefix, hops < 1, an invalid header name, a header without
// trusted proxies, or trusted proxies without a header.
func IPKey(opts ...IPOption) KeyFunc {
	k := NewIPKeyer(opts...)
	return func(r *http.Request) (string, error) {
		return k.Key(r.RemoteAddr, r.Header.Values)
	}
}

// IPKeyer finds the key of a client by its IP address, as [IPKey] does, for
// servers that are not net/http: grpclimit uses it with gRPC metadata. It
// is safe for concurrent use.
type IPKeyer struct {
	trusted []netip.Prefix
	source  ipSource
	header  string // canonical
	hops    int
	v4Bits  int
	v6Bits  int
}

// NewIPKeyer returns an IPKeyer with the options of [IPKey], and panics on
// the same invalid options.
func NewIPKeyer(opts ...IPOption) *IPKeyer {
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
	switch {
	case cfg.source == fromPeer && len(trusted) > 0:
		panic("httplimit: WithTrustedProxies without a header: say which one the proxies set " +
			"(WithRealIPHeader, WithXForwardedFor or WithForwarded)")
	case cfg.source != fromPeer && len(trusted) == 0:
		panic(fmt.Sprintf("httplimit: %s header without WithTrustedProxies: "+
			"say which peers may set it (0.0.0.0/0 and ::/0 for any)", cfg.header))
	case cfg.source == fromSingle && !validHeaderName(cfg.header):
		panic(fmt.Sprintf("httplimit: WithRealIPHeader: invalid header name %q", cfg.header))
	case (cfg.source == fromXFF || cfg.source == fromForwarded) && cfg.hops < 1:
		panic(fmt.Sprintf("httplimit: %s: %d hops, want at least 1", cfg.header, cfg.hops))
	}
	return &IPKeyer{
		trusted: trusted,
		source:  cfg.source,
		header:  http.CanonicalHeaderKey(cfg.header),
		hops:    cfg.hops,
		v4Bits:  cfg.v4Bits,
		v6Bits:  cfg.v6Bits,
	}
}

// Key returns the key of a client whose connection comes from remoteAddr
// ("ip", "ip:port" or "[ip]:port", as in Request.RemoteAddr); header
// returns the values of a request header field, one per field line in the
// order received, as http.Header.Values does (it may be nil when the
// server has no headers). The error, when remoteAddr is not an IP address,
// does not wrap [ErrNoKey].
func (k *IPKeyer) Key(remoteAddr string, header func(name string) []string) (string, error) {
	peer, ok := parseNode(remoteAddr)
	if !ok {
		return "", fmt.Errorf("httplimit: RemoteAddr %q is not an IP address", remoteAddr)
	}
	addr := peer
	if k.source != fromPeer && header != nil && k.isTrusted(peer) {
		if a, ok := k.forwarded(header(k.header)); ok {
			addr = a
		}
	}
	return k.group(addr), nil
}

// forwarded returns the client address in lines, the field lines of the
// configured header, and false when they are unusable.
func (k *IPKeyer) forwarded(lines []string) (netip.Addr, bool) {
	switch k.source {
	case fromSingle:
		if len(lines) != 1 || len(lines[0]) > maxElement {
			return netip.Addr{}, false
		}
		return parseNode(trimOWS(lines[0]))
	case fromXFF:
		return fromRight(lines, k.hops, parseNode)
	case fromForwarded:
		return fromRight(lines, k.hops, forwardedFor)
	}
	return netip.Addr{}, false
}

// maxElement bounds the length of a header value or list element that is
// read. An address with a port and brackets is at most 47 bytes; a
// Forwarded element written by a proxy, with its by, host and proto
// parameters, fits easily. Longer ones are unusable.
const maxElement = 512

// fromRight reads the list that lines make, joined in order, from the
// right: it parses the first n non-empty elements with parse and returns
// the n-th, or false if there are fewer than n or one does not parse. The
// elements left of the n-th are never looked at, so their content (quotes,
// garbage, megabytes) cannot matter.
func fromRight(lines []string, n int, parse func(string) (netip.Addr, bool)) (netip.Addr, bool) {
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for line != "" {
			var elem string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				elem, line = line[j+1:], line[:j]
			} else {
				elem, line = line, ""
			}
			elem = trimOWS(elem)
			if elem == "" {
				continue
			}
			if len(elem) > maxElement {
				return netip.Addr{}, false
			}
			a, ok := parse(elem)
			if !ok {
				return netip.Addr{}, false
			}
			if n--; n == 0 {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}

// forwardedFor returns the node of the one "for" parameter of a Forwarded
// element (RFC 7239, section 4): pairs separated by ';', names in any
// case, values tokens or quoted strings. Quoted values with escapes, or
// with '"' inside, are refused: proxies write addresses, which need none.
func forwardedFor(elem string) (netip.Addr, bool) {
	var node string
	found := false
	for pair := range strings.SplitSeq(elem, ";") {
		name, value, ok := strings.Cut(pair, "=")
		if !ok {
			return netip.Addr{}, false
		}
		if !strings.EqualFold(trimOWS(name), "for") {
			continue
		}
		if found {
			return netip.Addr{}, false
		}
		found = true
		node = trimOWS(value)
		if strings.HasPrefix(node, `"`) {
			if len(node) < 2 || !strings.HasSuffix(node, `"`) {
				return netip.Addr{}, false
			}
			node = node[1 : len(node)-1]
			if strings.ContainsAny(node, `"\`) {
				return netip.Addr{}, false
			}
		}
	}
	if !found {
		return netip.Addr{}, false
	}
	return parseNode(node)
}

func (k *IPKeyer) isTrusted(a netip.Addr) bool {
	for _, p := range k.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// group returns the key of a: the address, or its network.
func (k *IPKeyer) group(a netip.Addr) string {
	bits := k.v6Bits
	if a.Is4() {
		bits = k.v4Bits
	}
	if bits == a.BitLen() {
		return a.String()
	}
	p, _ := a.Prefix(bits) // bits is within [0, BitLen], checked by NewIPKeyer
	return p.String()
}

// parseNode parses "ip", "ip:port", "[ip]:port" or "[ip]" (IPv6 only in
// brackets), dropping the zone and unmapping IPv4-mapped IPv6 addresses.
func parseNode(s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, err := netip.ParseAddrPort(s)
		switch {
		case err == nil:
			a = ap.Addr()
		case len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']':
			a, err = netip.ParseAddr(s[1 : len(s)-1])
			if err != nil || !a.Is6() {
				return netip.Addr{}, false
			}
		default:
			return netip.Addr{}, false
		}
	}
	return a.WithZone("").Unmap(), true
}

// trimOWS trims the optional white space of HTTP (spaces and tabs).
func trimOWS(s string) string { return strings.Trim(s, " \t") }

// validHeaderName reports whether s is a field name: a token (RFC 9110,
// section 5.1).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
