// Package answers keeps, for a limiter's fallback (FallbackLocal), the
// last answer Redis gave about each (key, rule) the limiter asked it
// about: the rule's remaining allowance, when it was asked and answered,
// and the reset, so that a key's stand-in starts from them when the key's
// node goes down, rather than full (a key at its limit stays limited).
//
// A [Table] is a map per shard from a seeded hash of the key and the rule
// to the [Answer], so its memory follows the (key, rule) pairs Redis
// answered (40 bytes an answer in the map's slots, about 50 to 100 with
// their spare room), up to the most it was made for; past that, a new
// answer takes the place of an arbitrary one of its shard. [Table.Note]
// takes its shard's lock once for all the rules of a call, and allocates
// only when the map grows. An answer holds the key's hash, not the key:
// two keys (or rules) whose 64-bit hashes agree would share an answer,
// which the seed makes as unlikely as it is impossible to aim at.
//
// Times are ns on the caller's monotonic clock; sig is the limits a call
// was answered under, and an answer is found only for the same sig. A
// Table is safe for concurrent use.
package answers

import (
	"hash/maphash"
	"math"
	"sync"
	"time"
)

// Table holds the last answers (see the package doc). Make one with [New].
type Table struct {
	seed   maphash.Seed
	per    int // answers a shard holds at most
	rules  int // rules a key may have: Forget drops as many
	shards [shards]shard
}

// shards is the number of shards; a key's rules share one, so that noting
// an answer takes one lock.
const shards = 16

type shard struct {
	mu sync.Mutex
	m  map[uint64]Answer // by answerKey; nil until an answer is noted in the shard
}

// Answer is what Redis last said of one rule of one key.
type Answer struct {
	At        int64 // when Redis answered (ns, the caller's monotonic clock)
	Remaining int64 // the rule's remaining allowance, the whole limit's, below its capacity
	sig       uint64
	rtt       uint32 // µs from when the call was sent to At (saturated: about 71 minutes)
	life      uint32 // s from At to the answer's reset, rounded up: of no use after it
}

// Sent is when the call that Redis answered was sent, on the clock of At.
func (v Answer) Sent() int64 { return v.At - int64(v.rtt)*int64(time.Microsecond) }

// End is when the answer is of no use any more, on the clock of At.
func (v Answer) End() int64 { return v.At + int64(v.life)*int64(time.Second) }

// New returns a Table of at most about size answers (as many as the
// fallback keeps stand-ins), for keys of at most rules rules each.
func New(size, rules int) *Table {
	return &Table{seed: maphash.MakeSeed(), per: (size + shards - 1) / shards, rules: rules}
}

// Hash is the hash of the key state, for Get.
func (a *Table) Hash(state string) uint64 { return maphash.String(a.seed, state) }

// shard returns the shard of the key h.
func (a *Table) shard(h uint64) *shard { return &a.shards[h>>60] }

// answerKey is the map key of rule i of the key h.
func answerKey(h uint64, i int) uint64 {
	x := h + uint64(i)*0x9e3779b97f4a7c15
	return x ^ x>>29
}

// Note records Redis's answer, at now, to a call under the limits sig
// sent at sent, for the key state: left[i] is rule i's remaining
// allowance after the call, or negative when the answer says nothing of
// rule i; the answer is of use until resetAfter from now.
func (a *Table) Note(state string, sig uint64, sent, now int64, resetAfter time.Duration, left []int64) {
	var s *shard
	var h uint64
	var v Answer
	for i, l := range left {
		if l < 0 {
			continue
		}
		if s == nil {
			v = Answer{sig: sig, At: now,
				rtt:  uint32(min(max(now-sent, 0)/int64(time.Microsecond), math.MaxUint32)),
				life: uint32(min((int64(resetAfter)+int64(time.Second)-1)/int64(time.Second), math.MaxUint32))}
			h = a.Hash(state)
			s = a.shard(h)
			s.mu.Lock()
			if s.m == nil {
				s.m = make(map[uint64]Answer)
			}
		}
		v.Remaining = l
		k := answerKey(h, i)
		if len(s.m) >= a.per {
			if _, held := s.m[k]; !held {
				for old := range s.m { // an arbitrary one makes room
					delete(s.m, old)
					break
				}
			}
		}
		s.m[k] = v
	}
	if s != nil {
		s.mu.Unlock()
	}
}

// Get returns the answer noted for rule i of the key h (see Hash) under
// the limits sig, if one is, and it is still of use at now (before its
// End).
func (a *Table) Get(h uint64, i int, sig uint64, now int64) (Answer, bool) {
	s := a.shard(h)
	s.mu.Lock()
	v, ok := s.m[answerKey(h, i)]
	s.mu.Unlock()
	if !ok || v.sig != sig || now >= v.End() {
		return Answer{}, false
	}
	return v, true
}

// Forget drops the answers noted for the key state (a Reset).
func (a *Table) Forget(state string) {
	h := a.Hash(state)
	s := a.shard(h)
	s.mu.Lock()
	for i := range a.rules {
		delete(s.m, answerKey(h, i))
	}
	s.mu.Unlock()
}

// Len returns the answers held.
func (a *Table) Len() int {
	n := 0
	for i := range a.shards {
		s := &a.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}
