package redlimit

import (
	"hash/maphash"
	"math"
	"math/bits"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// answers keeps, for the fallback (FallbackLocal), the last answer Redis
// gave about each (key, rule) this limiter asked it about: the rule's
// remaining allowance and the reset, so that a key's stand-in starts from
// them when the key's node goes down, rather than full (a key at its limit
// stays limited).
//
// It is a fixed table of slots indexed by a seeded hash of the key and
// the rule, one answer a slot, the latest written over whatever was there:
// its memory is bounded whatever keys arrive (as many slots as the
// fallback keeps stand-ins, WithFallbackKeys, rounded down to a power of
// two; 48 bytes each, allocated a stripe at a time on first use), keys
// that Redis answers often (the busy ones) are the likeliest to be found,
// and noting an answer allocates nothing. A slot holds the key's hash, not
// the key: two keys (or rules) whose 64-bit hashes agree would share an
// answer, which the seed makes as unlikely as it is impossible to aim at.
type answers struct {
	seed    maphash.Seed
	mask    uint64 // slots - 1
	shift   uint   // a slot's stripe is its index >> shift
	stripes []answerStripe
}

type answerStripe struct {
	mu    sync.Mutex
	slots []answer // nil until an answer is noted in the stripe
}

// answer is what Redis last said of one rule of one key.
type answer struct {
	tag       uint64 // the key's hash, never 0; 0: an empty slot
	sig       uint64 // the limits of the call (ruleSet.sig)
	at        int64  // when Redis answered, monoNow
	end       int64  // at + the answer's ResetAfter: of no use after it
	remaining int64  // Result.Remaining, below the rule's capacity
	rule      uint8  // the rule's index in its ruleSet
}

// answerStripe holds at most stripeSlots slots (24 KB), so that a limiter
// that asked about a few keys holds little.
const stripeSlots = 512

func newAnswers(slots int) *answers {
	n := uint64(1) << (bits.Len(uint(max(slots, 1))) - 1) // a power of two, at most slots
	per := min(n, stripeSlots)
	return &answers{
		seed:    maphash.MakeSeed(),
		mask:    n - 1,
		shift:   uint(bits.TrailingZeros64(per)),
		stripes: make([]answerStripe, n/per),
	}
}

// hash is the tag of the key whose first state key is state.
func (a *answers) hash(state string) uint64 { return maphash.String(a.seed, state) | 1 }

// slot returns the stripe and the index in it of rule i of the key h.
func (a *answers) slot(h uint64, i int) (*answerStripe, uint64) {
	x := h + uint64(i)*0x9e3779b97f4a7c15
	x ^= x >> 29
	x &= a.mask
	return &a.stripes[x>>a.shift], x & (1<<a.shift - 1)
}

// note records Redis's answer res, of reason why, to a call on rs for the
// key whose first state key is state: the deciding rule's Remaining (the
// least over the rules, so at most the deciding rule's own) and the
// ResetAfter. A block's answer is not a rule's (the block is kept apart,
// see rescue.block), and a rule found full says nothing a stand-in does
// not know.
func (a *answers) note(state string, rs *ruleSet, res *Result, why reason) {
	if why == reasonBlock {
		return
	}
	i := 0
	if len(rs.rules) > 1 {
		for i = len(rs.rules) - 1; i > 0 && rs.rules[i].name != res.Rule; i-- {
		}
	}
	capacity := rs.rules[i].capacity()
	if res.Remaining >= capacity {
		return
	}
	h := a.hash(state)
	st, j := a.slot(h, i)
	now := monoNow()
	v := answer{tag: h, sig: rs.sig, at: now, end: now + int64(res.ResetAfter), remaining: int64(max(res.Remaining, 0)), rule: uint8(i)}
	st.mu.Lock()
	if st.slots == nil {
		st.slots = make([]answer, 1<<a.shift)
	}
	st.slots[j] = v
	st.mu.Unlock()
}

// get returns the answer noted for rule i of the key h under the limits
// sig, if one is, and it is still of use at now (before its reset).
func (a *answers) get(h uint64, i int, sig uint64, now int64) (answer, bool) {
	st, j := a.slot(h, i)
	st.mu.Lock()
	var v answer
	if st.slots != nil {
		v = st.slots[j]
	}
	st.mu.Unlock()
	if v.tag != h || v.rule != uint8(i) || v.sig != sig || now >= v.end {
		return answer{}, false
	}
	return v, true
}

// forget drops the answers noted for the key whose first state key is
// state (a Reset).
func (a *answers) forget(state string) {
	h := a.hash(state)
	for i := range MaxRules {
		st, j := a.slot(h, i)
		st.mu.Lock()
		if st.slots != nil && st.slots[j].tag == h && st.slots[j].rule == uint8(i) {
			st.slots[j] = answer{}
		}
		st.mu.Unlock()
	}
}

// recall starts set's stand-ins from the answers Redis gave about them
// since set last looked (set.recalled): when the key's node went down,
// the answers given while it was up, and after an answer to a call in
// flight, that one. set.mu is held.
func (r *rescue) recall(set *localSet, state string, rs *ruleSet, now time.Time) {
	a := r.answers
	if a == nil {
		return
	}
	mono := monoNow()
	var h uint64
	for i := range set.lims {
		if h == 0 {
			h = a.hash(state)
		}
		v, ok := a.get(h, i, rs.sig, mono)
		if !ok || v.at <= set.recalled {
			continue
		}
		r.startFrom(&set.lims[i], &rs.rules[i], v, now.Add(-time.Duration(mono-v.at)))
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
	if k > 0 {
		reserveAt(lr.lim, at, k) // a queue: k slots taken
	}
}
