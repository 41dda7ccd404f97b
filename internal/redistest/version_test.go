package redistest

import "testing"

func TestParseVersion(t *testing.T) {
	for _, tt := range []struct {
		out  string
		want Version
	}{
		{"Redis server v=6.0.16 sha=00000000:0 malloc=jemalloc-5.2.1 bits=64 build=ad68bbf775a89417\n", Version{"Redis", 6, 0, 16}},
		{"Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c971a948f0\n", Version{"Redis", 7, 0, 15}},
		{"Valkey server v=8.1.1 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=384b3c0d511f998a\n", Version{"Valkey", 8, 1, 1}},
	} {
		got, err := parseVersion(tt.out)
		if err != nil || got != tt.want {
			t.Errorf("parseVersion(%q) = %v, %v; want %v", tt.out, got, err, tt.want)
		}
	}
	if v, err := parseVersion("redis-cli 8.0.2\n"); err == nil {
		t.Errorf("parseVersion(redis-cli output) = %v, want an error", v)
	}

	v := Version{"Redis", 6, 2, 0}
	for _, tt := range []struct {
		major, minor int
		want         bool
	}{{6, 0, true}, {6, 2, true}, {6, 3, false}, {7, 0, false}, {5, 9, true}} {
		if got := v.AtLeast(tt.major, tt.minor); got != tt.want {
			t.Errorf("%v.AtLeast(%d, %d) = %v, want %v", v, tt.major, tt.minor, got, tt.want)
		}
	}
}
