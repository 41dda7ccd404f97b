// Package hotkey keeps what a limiter's prefetching knows of one key in
// this process: how many events it saw lately (a sliding counter over the
// prefetch's maximum age), what Redis last said it has left, the events of
// prefetches taken off it and not yet given back, and when its fixed
// window ends; and the size of prefetch that warrants. Times are
// nanoseconds on the process's monotonic clock. A State is not safe for
// concurrent use: its owner locks it.
package hotkey

const (
	// MinEvents is the smallest prefetch worth taking; a key is hot when
	// it saw at least this many events here in the last maximum age.
	MinEvents = 4
	// Share is the part of the Remaining that Redis last reported for the
	// key that a prefetch takes at most: 1/Share.
	Share = 4
)

// State is one key's prefetch bookkeeping. Its zero value knows nothing of
// the key but its Remaining, which is 0: use New.
type State struct {
	// Events seen here: cur since winStart, prev in the window before.
	winStart  int64
	cur, prev int64

	Remaining int   // the Remaining Redis last reported; -1: unknown
	Pending   int   // events of prefetches taken off this key and not yet given back
	WindowEnd int64 // a fixed window: when the window Redis last reported ends; 0: unknown
}

// New returns the State of a key not seen yet.
func New() State { return State{Remaining: -1} }

// Forget drops what Redis said of the key (after a Reset, which empties
// it): the next answer tells again.
func (s *State) Forget() { s.Remaining, s.WindowEnd = -1, 0 }

// Record counts n events at now in the key's rate estimate, whose window
// is w.
func (s *State) Record(now int64, n int, w int64) {
	switch d := now - s.winStart; {
	case d >= 2*w || d < 0:
		s.prev, s.cur, s.winStart = 0, 0, now
	case d >= w:
		s.prev, s.cur, s.winStart = s.cur, 0, s.winStart+w
	}
	s.cur += int64(n)
}

// Recent returns the events seen here in the last w, as the sliding
// counter estimates them (prev evenly spread).
func (s *State) Recent(now int64, w int64) int64 {
	d := now - s.winStart
	switch {
	case d >= 2*w || d < 0:
		return 0
	case d >= w:
		return int64(float64(s.cur) * float64(2*w-d) / float64(w))
	}
	return s.cur + int64(float64(s.prev)*float64(w-d)/float64(w))
}

// Sizing is what the size of a prefetch depends on besides its key.
type Sizing struct {
	Max         int   // the most events one key holds here (prefetched and pending)
	MaxAge      int64 // how long a prefetch serves; the window of the rate estimate
	FixedWindow bool  // the key is a fixed window: a prefetch ends with the window
}

// Size returns the size of the prefetch to take at now for a call of n
// events, or 0 for none: what the key saw in the last MaxAge (to the end
// of its fixed window, if sooner), at most Max less what is pending and
// 1/Share of what Redis last said was left, and at least MinEvents and 2n.
func (s *State) Size(now int64, n int, z Sizing) int {
	if s.Remaining < 0 {
		return 0
	}
	want := s.Recent(now, z.MaxAge)
	if z.FixedWindow && s.WindowEnd != 0 {
		// A fixed window's prefetch ends with its window: hold no more than
		// the key's rate here until then.
		left := s.WindowEnd - now
		if left <= 0 {
			return 0 // a new window: learn what it has left first
		}
		if left < z.MaxAge {
			want = int64(float64(want) * float64(left) / float64(z.MaxAge))
		}
	}
	// What prefetches taken off this key still hold until they are given back
	// counts against Max: one key never holds more than Max idle here.
	k := min(int64(z.Max-s.Pending), want, int64(s.Remaining/Share))
	if k < int64(max(MinEvents, 2*n)) {
		return 0
	}
	return int(k)
}
