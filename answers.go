package redlimit

import (
	"math"
	"math/rand/v2"
	"time"

	"golang.org/x/time/rate"

	"github.com/redlimit/redlimit/internal/answers"
	"github.com/redlimit/redlimit/internal/subring"
)

// Redis's last answers, for the fallback (FallbackLocal): the table that
// keeps them is internal/answers; here, what a reply says of each rule,
// and how a stand-in starts from an answer.

// ruleAnswers is what a script reply says of each rule of its call, beside
// the Result, for the answers (see parse and scripts/common.lua).
type ruleAnswers struct {
	// left is each rule's remaining allowance before the call, the whole
	// limit's (a priority share's kept part included); set only when has.
	left [MaxRules]int64
	has  bool // the reply carried left: several rules, or a call with a share
	none bool // the reply is no rule's answer (a penalty block's)
}

// newAnswers returns the table of a limiter's answers, of about size.
func newAnswers(size int) *answers.Table { return answers.New(size, MaxRules) }

// noteAnswer records in a Redis's answer res to a call of n on rs, sent
// at sent (monoNow), for the key whose first state key is state: each
// rule's remaining allowance after the call (from ra where the reply
// carried each rule's, else Result.Remaining, a single rule's) and the
// ResetAfter. A block's answer is not a rule's (the block is kept apart,
// see rescue.block); a rule found full, or one with a warm-up (whose
// stand-in follows its own curve), says nothing a stand-in does not know.
func noteAnswer(a *answers.Table, state string, rs *ruleSet, n int, res *Result, ra *ruleAnswers, sent int64) {
	if ra.none {
		return
	}
	var left [MaxRules]int64
	noted := false
	for i := range rs.rules {
		ru := &rs.rules[i]
		left[i] = -1
		var l int64
		switch {
		case ra.has:
			l = ra.left[i]
			if res.Allowed && n > 0 {
				l -= int64(ru.count(n))
			}
		case i == 0:
			l = int64(res.Remaining)
		default:
			continue
		}
		if ru.alg.warm || l >= int64(ru.capacity()) {
			continue
		}
		left[i] = max(l, 0)
		noted = true
	}
	if noted {
		a.Note(state, rs.sig, sent, monoNow(), res.ResetAfter, left[:len(rs.rules)])
	}
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
			h = a.Hash(state)
		}
		v, ok := a.Get(h, i, rs.sig, mono)
		if !ok || v.At <= set.recalled {
			continue
		}
		lr, ru := &set.lims[i], &rs.rules[i]
		at := now.Add(-time.Duration(mono - v.At))
		if v.Sent() > set.recalled {
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
func (r *rescue) startFrom(lr *localRule, ru *rule, v answers.Answer, at time.Time) {
	share := r.e.cfg.share
	capacity := ru.capacity()
	c := float64(capacity) * share
	used := min(max(float64(capacity-int(v.Remaining))*share, 0), c)
	if lr.sub != nil {
		// Counted when Redis answered, so they count a Period from then:
		// the stand-in never admits more than its capacity in a Period.
		lr.sub = subring.New(ru.limit.Period, ru.limit.SubWindows)
		if k := int(math.Ceil(used - 1e-9)); k > 0 {
			lr.sub.Take(k, at)
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
func (r *rescue) lower(lr *localRule, ru *rule, v answers.Answer, at, now time.Time) {
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
