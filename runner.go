package redlimit

import (
	"math/bits"

	"github.com/redis/go-redis/v9"
)

// runner asks Redis to decide a request under its rule set, with the keys
// and the call's arguments that engine.eval put in r.args (see
// scripts/common.lua), and returns Redis's reply as it came. Each rule set
// has one, chosen when the rule set is made (newRuleSet, bake); what every
// reply goes through after it is engine.answered's.
type runner interface {
	run(e *engine, r *request) (any, error)
}

// argsRunner runs the engine's script (or, for a warm-up rule, the script
// that holds warm-up) with the rules as arguments: the runner of limits
// from WithLimitFunc and WithRulesFunc, and of rule sets past
// maxBakedScripts.
type argsRunner struct{ warm bool }

func (ar argsRunner) run(e *engine, r *request) (any, error) {
	script := e.script
	if ar.warm {
		script = warmScript()
	}
	a := &r.args
	for i := range r.rs.rules {
		a.args = append(a.args, r.rs.rules[i].args[:]...)
	}
	appendShare(r)
	return script.Run(r.ctx, e.rdb, a.keys, a.args...).Result()
}

// writtenRunner runs the script with the rules written in (see bake);
// single: the script specialised for a single rule (singleSource).
type writtenRunner struct {
	script *redis.Script
	single bool
}

func (wr writtenRunner) run(e *engine, r *request) (any, error) {
	trim(r, wr.single)
	return wr.script.Run(r.ctx, e.rdb, r.args.keys, r.args.args...).Result()
}

// functionRunner runs the Redis Function with the rules written in
// (WithRedisFunctions), or the same script where the server cannot run it.
type functionRunner struct {
	fn     *redisFunction
	script *redis.Script
	single bool // the script (and Function) specialised for a single rule
}

func (fr functionRunner) run(e *engine, r *request) (any, error) {
	trim(r, fr.single)
	a := &r.args
	if !e.noFunctions.Load() {
		if reply, ok, err := e.fcall(r.ctx, fr.fn, a.keys, a.args); ok {
			return reply, err
		}
	}
	return fr.script.Run(r.ctx, e.rdb, a.keys, a.args...).Result()
}

// specialisedRunner runs a single rule's (or a policy's) usual calls
// with the script (or Redis Function) specialised for it (see
// singleSource and policySource in scripts.go), a call with a priority
// share with the same script with that share written in, where bake made
// one (shares, by share: bakeShares), and a reservation, which that script
// does not make, with the general one (all as bake chose: scripts, or
// Functions with scripts as fallback).
type specialisedRunner struct {
	one, general runner
	shares       map[int64]runner
}

func (sr specialisedRunner) run(e *engine, r *request) (any, error) {
	if r.rc != nil {
		return sr.general.run(e, r)
	}
	if r.share != 0 {
		if one, ok := sr.shares[r.share]; ok {
			return one.run(e, r)
		}
	}
	return sr.one.run(e, r)
}

// sharedRunner runs a call with a priority share on the script with that
// share written in (bakeShares), sending none: the reply is still one of
// a call with a share (a sixth integer), as the rest of the call expects
// of r.share.
type sharedRunner struct{ one runner }

func (sr sharedRunner) run(e *engine, r *request) (any, error) {
	share := r.share
	r.share = 0 // (for trimSingle: not sent)
	reply, err := sr.one.run(e, r)
	r.share = share
	return reply, err
}

// calendarRunner runs the script of rules with a calendar rule among them:
// the rules are arguments, a calendar rule's window chosen for the call's
// time (see evalCalendar).
type calendarRunner struct{}

func (calendarRunner) run(e *engine, r *request) (any, error) {
	return e.evalCalendar(r)
}

// calendarSingleRunner runs a single calendar rule's usual calls with the
// script specialised for it (scripts/single_calendar.lua, see
// bakeCalendar), and a reservation, which that script does not make, with
// the general one (evalCalendar).
type calendarSingleRunner struct{ one *redis.Script }

func (cr calendarSingleRunner) run(e *engine, r *request) (any, error) {
	if r.rc != nil {
		return e.evalCalendar(r)
	}
	return e.evalCalendarSingle(r, cr.one)
}

// trim leaves out the trailing arguments that a script with the rules
// written in takes as their defaults: trimSingle's for a script
// specialised for a single rule, else trimDefaults's.
func trim(r *request, single bool) {
	if single {
		trimSingle(r)
	} else {
		trimDefaults(r)
	}
}

// trimSingle leaves out the trailing arguments of a script specialised for
// a single rule or a policy (scripts/single_args.lua reads them for both)
// that are their defaults, the number of rules made 1 (a policy's script
// knows its own), and sends a priority share as
// -(c + 1), c the capacity it leaves the rule: in place of n = 1, or else
// of the number of rules, which that script does not read
// (scripts/single_args.lua; a warming bucket takes no share, and its
// script reads only whether there is one). The usual call with a share
// then sends one argument, not the seven of the general layout and the
// share, and Redis does no arithmetic for it.
func trimSingle(r *request) {
	a := &r.args
	a.args[1] = defaultArgs[1]
	if r.share != 0 {
		c := -shareCapacity(int64(r.rs.rules[0].capacity()), r.share) - 1
		if a.args[0] == defaultArgs[0] {
			a.args[0] = c
		} else {
			a.args[1] = c
		}
	}
	for len(a.args) > 0 {
		i := len(a.args) - 1
		if a.args[i] != defaultArgs[i] {
			break
		}
		a.args = a.args[:i]
	}
}

// trimDefaults leaves out the trailing arguments of a script with the
// rules written in that are their defaults (see scripts/common.lua), the
// number of rules being the script's own (writtenCount), then adds the
// call's priority share, if any.
func trimDefaults(r *request) {
	a := &r.args
	for r.share == 0 && len(a.args) > 0 {
		i := len(a.args) - 1
		if a.args[i] != defaultArgs[i] && (i != 1 || a.args[i] != any(len(r.rs.rules))) {
			break
		}
		a.args = a.args[:i]
	}
	appendShare(r)
}

// appendShare adds the call's priority share after the other arguments (the
// rules', or ARGV[8]: see scripts/common.lua), if it has one.
func appendShare(r *request) {
	if r.share != 0 {
		r.args.args = append(r.args.args, r.share)
	}
}

// shareCapacity returns floor(share × burst / 1e6): the capacity a
// priority share (ppm) leaves a bucket of burst, as scripts/check.lua
// counts it, exactly (burst below 2^53).
func shareCapacity(burst, share int64) int64 {
	hi, lo := bits.Mul64(uint64(burst), uint64(share))
	q, _ := bits.Div64(hi, lo, 1_000_000)
	return int64(q)
}
