// Package hashslot computes Redis Cluster hash slots locally, as the
// server's CLUSTER KEYSLOT does: the CRC-16/XMODEM of the key's hash tag,
// or of the whole key, modulo 16384.
package hashslot

import (
	"strings"
	"sync"
)

// Count is the number of hash slots of a Redis Cluster.
const Count = 16384

// Of returns the hash slot of key: CRC16 of its hash tag (what lies
// between the first '{' and the first '}' after it, if that is not empty),
// or of the whole key, modulo Count. So "{user42}:a" and "{user42}:b"
// share a slot, while "a{}b" is hashed whole.
func Of(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(CRC16(key) % Count)
}

// CRC16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), as in
// Redis's crc16.c.
func CRC16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = Next(crc, s[i])
	}
	return crc
}

// Next carries the CRC16 of a string on to the string followed by c, so
// that callers can hash many strings that share a prefix.
func Next(crc uint16, c byte) uint16 {
	return crc<<8 ^ table[byte(crc>>8)^c]
}

var table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

var (
	tagsOnce sync.Once
	tags     *[Count]string
)

// Tag returns a short hash tag (1 to 3 letters or digits) whose slot is
// slot: "{"+Tag(slot)+"}" names a key of that slot. The table of all Count
// tags is built on first use, in about 1ms.
func Tag(slot int) string {
	tagsOnce.Do(buildTags)
	return tags[slot]
}

// buildTags gives each slot the first string of letters and digits,
// shortest first, whose slot it is. Strings of up to 3 characters cover
// every slot; the CRC of a string is carried on from its prefix's.
func buildTags() {
	const digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	var (
		found [Count][4]byte // the tag, and its length in the last byte
		left  = Count
		walk  func(prefix []byte, crc uint16, depth int)
	)
	walk = func(prefix []byte, crc uint16, depth int) {
		for i := 0; i < len(digits) && left > 0; i++ {
			c := Next(crc, digits[i])
			s := append(prefix, digits[i])
			if depth == 1 {
				if t := &found[c%Count]; t[3] == 0 {
					copy(t[:], s)
					t[3] = byte(len(s))
					left--
				}
				continue
			}
			walk(s, c, depth-1)
		}
	}
	for n := 1; left > 0 && n <= 4; n++ {
		walk(make([]byte, 0, 4), 0, n)
	}
	tags = joinTags(&found)
}

// joinTags makes one string of every tag found, and each tag a slice of it.
func joinTags(found *[Count][4]byte) *[Count]string {
	var all []byte
	var ends [Count]int
	for i := range found {
		all = append(all, found[i][:found[i][3]]...)
		ends[i] = len(all)
	}
	s := string(all)
	t := new([Count]string)
	for i := range t {
		start := 0
		if i > 0 {
			start = ends[i-1]
		}
		t[i] = s[start:ends[i]]
	}
	return t
}
