// Package hashslot computes Redis Cluster hash slots locally, as the
// server's CLUSTER KEYSLOT does: the CRC-16/XMODEM of the key's hash tag,
// or of the whole key, modulo 16384.
package hashslot

import "strings"

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
