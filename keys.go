package redlimit

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// MaxKeyLen is the longest key kept as it is in Redis key names. A longer
// key is replaced by "%h" and the hex SHA-256 of the key (66 bytes), still
// inside the hash tag, so that one key is one cluster slot and a huge key
// (an attacker's header, say) costs neither Redis memory nor time on every
// call. "%h" cannot come out of escaping, so a hashed key never meets a
// short one. It is not a bound on keys (any non-empty key is valid) but
// part of the key layout (see [WithPrefix]) that tools reading Redis
// rebuild, as cmd/redlimit's inspect does.
const MaxKeyLen = 256

// escapeKey makes a user key safe to put inside a hash tag: '%', '{' and '}'
// are percent-encoded, so the tag ends at the first '}' and two different
// keys never give the same Redis key; keys longer than MaxKeyLen are hashed.
func escapeKey(key string) string {
	if len(key) > MaxKeyLen {
		sum := sha256.Sum256([]byte(key))
		return "%h" + hex.EncodeToString(sum[:])
	}
	if !strings.ContainsAny(key, "%{}") {
		return key
	}
	var b strings.Builder
	b.Grow(len(key) + 8)
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
