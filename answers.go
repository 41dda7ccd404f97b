package redlimit

import (
	"hash/maphash"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// answers keeps, for the fallback (FallbackLocal), the last answer Redis
// gave about each (key, rule) this limiter asked it about: the rule's
// remaining allowance, when it was asked and answered, and the reset, so
// that a key's stand-in starts from them when the key's node goes down,
// rather than full (a key at its limit stays limited).
//
// It is a map per shard from a seeded hash of the key and the rule to
// the answer, so its memory follows the (key, rule) pairs Redis answered
// (40 bytes an answer in the map's slots, about 50 to 100 with their
// spare room), up to as many as the fallback keeps stand-ins
// (WithFallbackKeys); past that, a new answer takes the place of an
// arbitrary one of its shard. Noting an answer takes its shard's lock and
// allocates only when the map grows. An answer holds the key's hash, not
// the key: two keys (or rules) whose 64-bit hashes agree would share an
// answer, which the seed makes as unlikely as it is impossible to aim at.
type answers struct {
	seed   maphash.Seed
	per    int // answers a shard holds at most
	shards [answerShards]answerShard
}

// answerShards is the number of shards; a key's rules share one, so that
// noting an answer takes one lock.
const answerShards = 16

type answerShard struct {
	mu sync.Mutex
	m  map[uint64]answer // by answerKey; nil until an answer is noted in the shard
}

// answer is what Redis last said of one rule of one key.
type answer struct {
	sig       uint64 // the limits of the call (ruleSet.sig)
	at        int64  // when Redis answered, monoNow
	remaining int64  // the rule's remaining allowance, the whole limit's, below its capacity
	rtt       uint32 // µs from when the call was sent to at (saturated: about 71 minutes)
	life      uint32 // s from at to the answer's reset, rounded up: of no use after it
}

// sent is when the call that Redis answered was sent, as monoNow.
func (v *answer) sent() int64 { return v.at - int64(v.rtt)*int64(time.Microsecond) }

// end is when the answer is of no use any more, as monoNow.
func (v *answer) end() int64 { return v.at + int64(v.life)*int64(time.Second) }

// ruleAnswers is what a script reply says of each rule of its call, beside
// the Result, for the answers (see parse and scripts/common.lua).
type ruleAnswers struct {
	// left is each rule's remaining allowance before the call, the whole
	// limit's (a priority share's kept part included); set only when has.
	left [MaxRules]int64
	has  bool // the reply carried left: several rules, or a call with a share
	none bool // the reply is no rule's answer (a penalty block's)
}

func newAnswers(max int) *answers {
	return &answers{seed: maphash.MakeSeed(), per: (max + answerShards - 1) / answerShards}
}

// hash is the hash of the key whose first state key is state.
func (a *answers) hash(state string) uint64 { return maphash.String(a.seed, state) }

// shard returns the shard of the key h.
func (a *answers) shard(h uint64) *answerShard { return &a.shards[h>>60] }

// answerKey is the map key of rule i of the key h.
func answerKey(h uint64, i int) uint64 {
	x := h + uint64(i)*0x9e3779b97f4a7c15
	return x ^ x>>29
}

// note records Redis's answer res to a call of n on rs, sent at sent
// (monoNow), for the key whose first state key is state: each rule's
// remaining allowance after the call (from ra where the reply carried
// each rule's, else Result.Remaining, a single rule's) and the
// ResetAfter. A block's answer is not a rule's (the block is kept apart,
// see rescue.block); a rule found full, or one with a warm-up (whose
// stand-in follows its own curve), says nothing a stand-in does not know.
func (a *answers) note(state string, rs *ruleSet, n int, res *Result, ra *ruleAnswers, sent int64) {
	if ra.none {
		return
	}
	var s *answerShard
	var h uint64
	var v answer
	for i := range rs.rules {
		ru := &rs.rules[i]
		var left int64
		switch {
		case ra.has:
			left = ra.left[i]
			if res.Allowed && n > 0 {
				left -= int64(ru.count(n))
			}
		case i == 0:
			left = int64(res.Remaining)
		default:
			continue
		}
		if ru.alg.warm || left >= int64(ru.capacity()) {
			continue
		}
		if s == nil {
			now := monoNow()
			v = answer{sig: rs.sig, at: now,
				rtt:  uint32(min(max(now-sent, 0)/int64(time.Microsecond), math.MaxUint32)),
				life: uint32(min((int64(res.ResetAfter)+int64(time.Second)-1)/int64(time.Second), math.MaxUint32))}
			h = a.hash(state)
			s = a.shard(h)
			s.mu.Lock()
			if s.m == nil {
				s.m = make(map[uint64]answer)
			}
		}
		v.remaining = max(left, 0)
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

// get returns the answer noted for rule i of the key h under the limits
// sig, if one is, and it is still of use at now (before its reset).
func (a *answers) get(h uint64, i int, sig uint64, now int64) (answer, bool) {
	s := a.shard(h)
	s.mu.Lock()
	v, ok := s.m[answerKey(h, i)]
	s.mu.Unlock()
	if !ok || v.sig != sig || now >= v.end() {
		return answer{}, false
	}
	return v, true
}

// forget drops the answers noted for the key whose first state key is
// state (a Reset).
func (a *answers) forget(state string) {
	h := a.hash(state)
	s := a.shard(h)
	s.mu.Lock()
	for i := range MaxRules {
		delete(s.m, answerKey(h, i))
	}
	s.mu.Unlock()
}

// len returns the answers held.
func (a *answers) len() int {
	n := 0
	for i := range a.shards {
		s := &a.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

// recall brings set's stand-ins up to the answers Redis gave about them
// since set last looked (set.recalled). An answer to a call sent after
// that (when the key's node went down, the answers given while it was up)
// starts its stand-in afresh from it. An answer to a call sent before it
// (a call in flight when the node was marked down, answered since) knows
// nothing of what the stand-in admitted meanwhile: it may only lower the
// stand-in, to what it says less what the stand-in admitted since it
// started. set.mu is held.
func (r *rescue) recall(set *localSet, state string, rs *ruleSet, now time.Time) {
	a := r.answers
	if a == nil {
		return
	}
	mono := monoNow()
	var h uint64
	for i := range set.lims {
		if i == 0 {
			h = a.hash(state)
		}
		v, ok := a.get(h, i, rs.sig, mono)
		if !ok || v.at <= set.recalled {
			continue
		}
		lr, ru := &set.lims[i], &rs.rules[i]
		at := now.Add(-time.Duration(mono - v.at))
		if v.sent() > set.recalled {
			r.startFrom(lr, ru, v, at)
			continue
		}
		r.lower(lr, ru, v, at, now)
	}
	set.recalled = mono
}

// startFrom makes lr, the stand-in of ru, what Redis's answer v said at
// at, scaled to the fallback share, and refilled since: a stand-in of c
// events (capacity × share, kept on average when fractional, as newLocal
// does) with (capacity − Remaining) × share of them used.
func (r *rescue) startFrom(lr *localRule, ru *rule, v answer, at time.Time) {
	share := r.e.cfg.share
	capacity := ru.capacity()
	c := float64(capacity) * share
	used := min(max(float64(capacity-int(v.remaining))*share, 0), c)
	if lr.sub != nil {
		// Counted when Redis answered, so they count a Period from then:
		// the stand-in never admits more than its capacity in a Period.
		lr.sub = newSubRing(ru.limit.Period, ru.limit.SubWindows)
		if k := int(math.Ceil(used - 1e-9)); k > 0 {
			lr.sub.take(k, at)
		}
		return
	}
	debt := float64(lr.capacity) - c + used // lr.capacity is ceil(c)
	k := int(math.Floor(debt))
	if rand.Float64() < debt-float64(k) {
		k++
	}
	lr.lim = rate.NewLimiter(rate.Limit(lr.every), lr.burst)
	lr.taken = 0
	if k > 0 {
		reserveAt(lr.lim, at, k) // a queue: k slots taken
	}
}

// lower makes lr, the stand-in of ru, no fuller than the late answer v
// (given at at, to a call sent before lr last decided) with the events lr
// admitted since it started taken off, as v cannot count them: lr keeps
// whichever of the two has less left at now.
func (r *rescue) lower(lr *localRule, ru *rule, v answer, at, now time.Time) {
	if lr.warm != nil {
		return // a warming stand-in follows its curve (see startFrom)
	}
	late := *lr
	r.startFrom(&late, ru, v, at)
	if lr.taken > 0 {
		reserveAt(late.lim, now, lr.taken)
	}
	if lr.queue && late.ahead(now) > lr.ahead(now) || !lr.queue && late.lim.TokensAt(now) < lr.lim.TokensAt(now) {
		lr.lim = late.lim
	}
}
