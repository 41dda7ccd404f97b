package hashslot

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOf(t *testing.T) {
	for _, tt := range []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3}, // the CRC-16/XMODEM check value
		{"foo", 12182},
		{"bar", 5061},
		{"user42", 14710},
		{"rl:{user42}:cnt", 14710},
		{"{user42}", 14710},
		{"a{}b", int(CRC16("a{}b") % Count)},
		{"a{b}{c}", int(CRC16("b") % Count)},
	} {
		if got := Of(tt.key); got != tt.want {
			t.Errorf("Of(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

// TestNext checks the table against the bitwise definition of CRC16.
func TestNext(t *testing.T) {
	bitwise := func(s string) uint16 {
		var crc uint16
		for i := 0; i < len(s); i++ {
			crc ^= uint16(s[i]) << 8
			for range 8 {
				if crc&0x8000 != 0 {
					crc = crc<<1 ^ 0x1021
				} else {
					crc <<= 1
				}
			}
		}
		return crc
	}
	for _, s := range []string{"", "a", "123456789", "redlimit:{k}:tb1000000", "\x00\xff\x80"} {
		if got, want := CRC16(s), bitwise(s); got != want {
			t.Errorf("CRC16(%q) = %#04x, want %#04x", s, got, want)
		}
	}
}

// Every slot has a tag of 1 to 3 letters or digits, in that slot, and no
// two slots share one.
func TestTag(t *testing.T) {
	seen := make(map[string]bool, Count)
	for slot := range Count {
		tag := Tag(slot)
		require.NotEmpty(t, tag)
		require.LessOrEqual(t, len(tag), 3, "slot %d", slot)
		require.Regexp(t, "^[0-9a-zA-Z]+$", tag, "slot %d", slot)
		require.Equal(t, slot, Of("{"+tag+"}"), "tag %q", tag)
		require.Equal(t, slot, int(CRC16(tag)%Count), "tag %q", tag)
		require.False(t, seen[tag], "tag %q twice", tag)
		seen[tag] = true
	}
	assert.Equal(t, "0", Tag(Of("0")), "the shortest tag first")
}
