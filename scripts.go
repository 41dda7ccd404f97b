package redlimit

import (
	"embed"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// readScripts returns the named parts, concatenated.
func readScripts(parts ...string) string {
	var src strings.Builder
	for _, p := range parts {
		src.WriteString(mustRead(p))
	}
	return src.String()
}

// decisionScript returns a decision script: common.lua, the strategies'
// files, args.lua, decide.lua, the rules' checks, region.lua and reply.lua, so that a
// decision is one EVALSHA of one self-contained script. checks is
// argumentChecks or the rules written in (writtenChecks), and count ""
// or, with the rules written in, their number (writtenCount).
func decisionScript(files []string, count, checks string) *redis.Script {
	return redis.NewScript(decisionHead(files) + decisionCall(count, checks))
}

// decisionHead is the part of a decision script that defines (common.lua
// and the strategies' files), and decisionCall the part that decides, from
// args.lua on: a Redis Function (functions.go) runs the first once, when
// its library is loaded, and the second on every call.
func decisionHead(files []string) string {
	return readScripts("common.lua") + readScripts(files...)
}

func decisionCall(count, checks string) string {
	return readScripts("args.lua") + count + readScripts("decide.lua") + checks + readScripts("region.lua", "reply.lua")
}

// writtenCount returns the line that tells a script with several rules
// written in their number, after args.lua, where a script whose rules
// come as arguments reads it (ARGV[2]): the client leaves it out with the
// other trailing defaults (see run in engine.go), and the script converts
// no string for it. "" for one rule: args.lua's default.
func writtenCount(rs *ruleSet) string {
	if len(rs.rules) < 2 {
		return ""
	}
	return "nrules = " + strconv.Itoa(len(rs.rules)) + " -- the rules written in (writtenCount in scripts.go)\n"
}

// argumentChecks checks rules passed as arguments, of the strategies whose
// files are in files: their table check_by_code (strategyTable), the queue of writes
// (queue.lua, with several rules), rules.lua, then check.lua in a loop over
// them, and with the buckets' file, slots.lua (a policy's leaky buckets'
// slots at its Delay).
func argumentChecks(files []string) string {
	checks := strategyTable(files) +
		"if nrules > 1 then\n" + mustRead("queue.lua") + "write, write_args = queue, queue_args\nend\n" +
		mustRead("rules.lua") +
		"for i = 1, nrules do\n" +
		"local strat, rate, period, burst, per_call = rule(i)\n" +
		"local check = check_by_code[strat]\n" +
		"local pxs\n" +
		mustRead("check.lua") +
		"end\n"
	if slices.Contains(files, strategyFiles[LeakyBucket]) {
		checks += mustRead("slots.lua")
	}
	return checks
}

// strategyTable returns the Lua line that makes check_by_code, the table from a
// strategy's code to its check function (check_<code>, see common.lua),
// for the strategies whose files are in files: where rules passed as
// arguments find their functions. (A script with its rules written in
// names each rule's function and makes no table.)
func strategyTable(files []string) string {
	var b strings.Builder
	b.WriteString("local check_by_code = {")
	for s, f := range strategyFiles {
		if slices.Contains(files, f) {
			code := algorithms[s].code
			b.WriteString(code + " = check_" + code + ", ")
		}
	}
	if slices.Contains(files, calendarFile) {
		b.WriteString(calendarCode + " = check_" + calendarCode + ", ")
	}
	b.WriteString("}\n")
	if slices.Contains(files, warmFile) {
		// A warm-up rule's code carries its warm-up (warmup.lua): any code
		// not in the table is one, 'wl...' the leaky bucket's.
		b.WriteString("setmetatable(check_by_code, {__index = function(_, c) if string.byte(c, 2) == 108 then return check_wl end return check_wt end})\n")
	}
	return b.String()
}

func mustRead(name string) string {
	b, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("redlimit: missing embedded script " + name) // the build embeds them all
	}
	return string(b)
}

// maxBakedScripts bounds the rule sets whose scripts have their rules
// written in that one process makes (two scripts for a single rule or a
// policy with a specialised one; a single rule's script with a priority
// share written in counts as one more, see bakeShares), and so what its
// limiters can add to Redis's script cache, which Redis before 7.4 never
// evicts. Limiters made past it pass their rules as arguments, as limits
// from WithLimitFunc always do. (A variable for the tests.)
var maxBakedScripts = 128

// baked holds the scripts with rules written in, by their rules' part.
var baked struct {
	sync.Mutex
	m map[string]bakedRules
}

// bakedRules is what bake makes for one set of rules: the general
// script and, where the rules have one, the script specialised for them
// (see singleSource and policySource); with functions, each as a Redis
// Function too.
type bakedRules struct {
	script, single *redis.Script
	fn, singleFn   *redisFunction
}

// singleRunner returns the runner of b's specialised script: the script,
// or with functions its Redis Function, the script as fallback.
func (b bakedRules) singleRunner(functions bool) runner {
	if functions {
		return functionRunner{fn: b.singleFn, script: b.single, single: true}
	}
	return writtenRunner{script: b.single, single: true}
}

// bakeSingle returns the baked entry whose specialised script is src (a
// calendar rule's, or a single rule's with a priority share written in),
// made once and kept by its source, with its Redis Function where
// functions; ok is false once maxBakedScripts are made. baked is locked.
func bakeSingle(src string, functions bool) (b bakedRules, ok bool) {
	b, ok = baked.m[src]
	if !ok {
		if len(baked.m) >= maxBakedScripts {
			return b, false
		}
		b.single = redis.NewScript(src)
	}
	if functions && b.singleFn == nil {
		b.singleFn = newFunction("", src)
	}
	if baked.m == nil {
		baked.m = make(map[string]bakedRules)
	}
	baked.m[src] = b
	return b, true
}

// bake sets rs.script to the decision script with the rules of rs written
// in (see writtenChecks) and, with functions (WithRedisFunctions) only,
// rs.fn to the same as a Redis Function; it leaves them nil when
// maxBakedScripts are made already. Limiters with the same rules share
// them. A single rule whose strategy has a specialised script
// (singleSource), or a policy that has one (policySource), runs that
// script for its usual calls (specialisedRunner), a single rule's with a
// priority share or none, a policy's only where cfg gives none, unless
// cfg gives every call a penalty block or regions, which only the general
// script handles: decided here, once.
func bake(rs *ruleSet, cfg *config) {
	if rs.calendar {
		bakeCalendar(rs, cfg)
		return
	}
	checks := writtenChecks(rs)
	baked.Lock()
	defer baked.Unlock()
	b, ok := baked.m[checks]
	if !ok && len(baked.m) >= maxBakedScripts {
		return
	}
	files := strategyFilesOf(rs.rules)
	held := heldFiles(rs)
	single := singleSource(rs, -1)
	if single == "" {
		single = policySource(rs)
	}
	if !ok {
		// In a script, written.lua's functions are made by the call's part,
		// as the whole script runs on every call anyway: made before it,
		// miniredis's Lua (gopher-lua 1.1.1) lost the value of n0, a local
		// of the call's part, once a rule had held its write; Redis's Lua
		// does not.
		b.script = decisionScript(files, writtenCount(rs), readScripts(held...)+checks)
		if single != "" {
			b.single = redis.NewScript(single)
		}
	}
	if cfg.functions && b.fn == nil {
		b.fn = newRedisFunction(append(files, held...), writtenCount(rs), checks)
		if single != "" {
			b.singleFn = newFunction("", single)
		}
	}
	if baked.m == nil {
		baked.m = make(map[string]bakedRules)
	}
	baked.m[checks] = b
	rs.script = b.script
	var run runner = writtenRunner{script: b.script}
	if cfg.functions {
		rs.fn = b.fn
		run = functionRunner{fn: b.fn, script: b.script}
	}
	rs.run = run
	// (With WithRegions, a call also writes the key's journal, which only
	// the general script does: scripts/region.lua.)
	// (A policy's script takes no priority share: policySource.)
	if b.single != nil && cfg.block == 0 && cfg.regions == nil && (len(rs.rules) == 1 || !cfg.priority.on) {
		rs.run = specialisedRunner{one: b.singleRunner(cfg.functions), general: run, shares: bakeShares(rs, cfg)}
	}
}

// bakeShares returns the runners of a single rule's usual calls with a
// priority share of cfg, by share (ppm): each runs the rule's script with
// the capacity the share leaves written in (singleSource), and sends the
// share no more (sharedRunner), so that Redis neither reads nor converts
// it; nil without shares or for several rules. A share whose script would
// pass maxBakedScripts has none: its calls send it to the rule's script.
// baked is locked.
func bakeShares(rs *ruleSet, cfg *config) map[int64]runner {
	if !cfg.priority.on || len(rs.rules) != 1 {
		return nil
	}
	var shares map[int64]runner
	for _, ppm := range cfg.priority.ppm {
		if ppm == 0 || shares[ppm] != nil {
			continue
		}
		b, ok := bakeSingle(singleSource(rs, shareCapacity(int64(rs.rules[0].capacity()), ppm)), cfg.functions)
		if !ok {
			break
		}
		if shares == nil {
			shares = make(map[int64]runner, 2)
		}
		shares[ppm] = sharedRunner{one: b.singleRunner(cfg.functions)}
	}
	return shares
}

// bakeCalendar gives a single calendar rule's usual calls (no penalty
// block, priority share or regions, and not per call: decided here, once)
// a script specialised for it, and its reservations the general one: for
// a day or a week in a zone that keeps one offset (calendar.Fixed: UTC,
// Asia/Tokyo), which is a fixed window of a day or a week, shifted, the
// fixed window's (single_fixedwindow.lua, with calendar.lua's state: the
// same windows' indexes, from the server's time, no window sent and none
// missed); else scripts/single_calendar.lua with the rule's rate written
// in, sent the window of the call's time (calendarSingleRunner). Other
// rule sets with a calendar rule keep the general script, the rules as
// arguments (calendarScript), and so does a single rule once
// maxBakedScripts are made.
func bakeCalendar(rs *ruleSet, cfg *config) {
	if len(rs.rules) != 1 || rs.rules[0].perCall || cfg.block != 0 || cfg.regions != nil || cfg.priority.on {
		return // (the specialised scripts count n: a rule per call counts 1)
	}
	rate := strconv.FormatInt(rs.rules[0].args[1].(int64), 10)
	period, shift, fixed := rs.rules[0].limit.cal.Fixed(time.Now())
	src := "-- The rule, written in by redlimit (see bakeCalendar in scripts.go).\n"
	if fixed {
		src += "local key, rate, period, burst, leaky, pxs = KEYS[1], " + rate + ", " + strconv.FormatInt(period, 10) + ", 0, false\n" +
			shiftLine(shift, true) + mustRead("single_args.lua") + readScripts(singleFiles[FixedWindow]...)
	} else {
		src += "local rate = " + rate + "\n" +
			readScripts("single_calendar.lua", "single_window.lua", "single_write.lua", "single_reply.lua")
	}
	baked.Lock()
	defer baked.Unlock()
	b, ok := bakeSingle(src, false)
	if !ok {
		return
	}
	if fixed {
		rs.run = specialisedRunner{one: b.singleRunner(false), general: calendarRunner{}}
		return
	}
	rs.run = calendarSingleRunner{one: b.single}
}

// singleFiles are the scripts specialised for a single rule written in, by
// strategy (none: the general script decides): what a limiter of one
// strategy runs for its usual call (see singleSource), its files in order.
var singleFiles = [...][]string{
	FixedWindow:      {"single_fixedwindow.lua", "single_window.lua", "single_write.lua", "single_reply.lua"},
	SlidingLog:       {"single_slidinglog.lua", "single_reply.lua"},
	SlidingCounter:   {"single_slidingcounter.lua", "single_write.lua", "single_reply.lua"},
	SubWindowCounter: {"single_subwindow.lua", "single_reply.lua"},
	TokenBucket:      {"single_bucket.lua", "single_write.lua", "single_reply.lua"},
	LeakyBucket:      {"single_bucket.lua", "single_write.lua", "single_reply.lua"},
}

// singleSource returns the script specialised for the one rule of rs: the
// rule's numbers as Lua constants, single_args.lua (the call's arguments
// and time), then its strategy's files of singleFiles, which decide a call with no penalty block, priority share
// or reservation as the general script does (TestSingleScriptDecidesAsGeneral);
// a warming bucket's is singleWarmSource's. With share >= 0, the script of
// the calls with a priority share that leaves the rule that capacity
// (sharedLine). "" for several rules, a rule per call, or a strategy
// without one.
func singleSource(rs *ruleSet, share int64) string {
	if len(rs.rules) != 1 {
		return ""
	}
	r := &rs.rules[0]
	if r.alg.warm && !r.perCall {
		return singleWarmSource(r, share)
	}
	if r.perCall || int(r.alg.strategy) >= len(singleFiles) || len(singleFiles[r.alg.strategy]) == 0 {
		return ""
	}
	return "-- The rule, written in by redlimit (see singleSource in scripts.go).\n" +
		writtenRule(r, 1) + mustRead("single_args.lua") + sharedLine(share) + readScripts(singleFiles[r.alg.strategy]...)
}

// sharedLine returns the line that writes a priority share into a single
// rule's script after single_args.lua, share_c the capacity it leaves the
// rule, as single_args.lua would read it from a call (see bakeShares);
// "" for share < 0, none.
func sharedLine(share int64) string {
	if share < 0 {
		return ""
	}
	return "shared, share_c = true, " + strconv.FormatInt(share, 10) + " -- (written in: bakeShares)\n"
}

// writtenRule returns the line that writes rule r, the i-th, into a
// script specialised for it (singleSource, policySource): its state key
// and numbers as Lua locals, as scripts/single_args.lua says.
func writtenRule(r *rule, i int) string {
	var b strings.Builder
	b.WriteString("local key, rate, period, burst, leaky, pxs = KEYS[" + strconv.Itoa(i) + "]")
	for _, v := range r.args[1:] { // rate, period, burst: as the arguments would carry them
		b.WriteString(", " + strconv.FormatInt(v.(int64), 10))
	}
	b.WriteString(", " + strconv.FormatBool(r.alg.strategy == LeakyBucket))
	if px := usualPX(r); px != "" {
		b.WriteString(", " + strings.TrimPrefix(px, " = "))
	}
	b.WriteString("\n")
	if r.alg.strategy == FixedWindow {
		b.WriteString(shiftLine(0, false))
	}
	return b.String()
}

// shiftLine returns the line that writes a fixed window's shift and
// whether it is a calendar's (see single_fixedwindow.lua).
func shiftLine(shift int64, calendar bool) string {
	return "local shift, calendar = " + strconv.FormatInt(shift, 10) + ", " + strconv.FormatBool(calendar) + "\n"
}

// maxPolicyScriptRules bounds the rules of a policy that runs the script
// specialised for it (policySource): the policies most have, whose
// nested blocks, which hold every rule's locals at once, stay within a Lua
// function's bounds (TestPolicyScriptMaxRules, on miniredis and Redis).
const maxPolicyScriptRules = 4

// policySource returns the script specialised for the usual call of a
// policy of rs's rules (scripts/policy_head.lua): each rule's files of
// singleFiles, less the write and the reply, in a block of its own, with
// policy_rule.lua after it, each rule's block nested in the block of the
// rule before it and ended by policy_write.lua; "" for one rule or more
// than maxPolicyScriptRules, or a rule other than a token bucket, a
// sliding counter or a fixed window (whose files write at most once), or
// per call, or warming.
func policySource(rs *ruleSet) string {
	k := len(rs.rules)
	if k < 2 || k > maxPolicyScriptRules {
		return ""
	}
	for i := range rs.rules {
		r := &rs.rules[i]
		switch {
		case r.perCall || r.alg.warm:
			return ""
		case r.alg.strategy != TokenBucket && r.alg.strategy != SlidingCounter && r.alg.strategy != FixedWindow:
			return ""
		}
	}
	var b strings.Builder
	b.WriteString("-- The rules, written in by redlimit (see policySource in scripts.go).\n")
	b.WriteString(mustRead("single_args.lua"))
	b.WriteString(mustRead("policy_head.lua"))
	tags := make([]string, k)
	for i := range tags {
		tags[i] = "a" + strconv.Itoa(i+1)
	}
	b.WriteString("local format = '<Bi8i8i8Bi8" + strings.Repeat("i8", k) + "'\n")
	b.WriteString("local " + strings.Join(tags, ", ") + "\n")
	for i := range rs.rules {
		b.WriteString("do " + policyBlock(&rs.rules[i], i+1))
		b.WriteString(tags[i] + " = avail\n")
	}
	for range rs.rules {
		b.WriteString(mustRead("policy_write.lua") + "end\n")
	}
	b.WriteString(strings.ReplaceAll(mustRead("policy_reply.lua"), "TAGS", strings.Join(tags, ", ")))
	return b.String()
}

// policyBlock returns the head of rule r's block in a policy's script,
// r being its i-th rule: its number and numbers written in, its
// strategy's files of singleFiles less the write and the reply, then
// policy_rule.lua. policy_write.lua and "end" close the block after the
// blocks of the rules after it (policySource).
func policyBlock(r *rule, i int) string {
	files := singleFiles[r.alg.strategy]
	return "local i = " + strconv.Itoa(i) + "\n" + writtenRule(r, i) +
		readScripts(files[:len(files)-2]...) + // less single_write.lua and single_reply.lua
		mustRead("policy_rule.lua")
}

// commitHeld ends a rule's block in a script with several rules written in:
// it makes the rule's held write (see written.lua) if every rule allowed.
const commitHeld = `if hc and not denied then
  if hb == nil then
    rcall(hc, hk, ha)
  elseif hx == nil then
    rcall(hc, hk, ha, hb)
  else
    rcall(hc, hk, ha, hb, hx)
  end
end
end
`

// writtenChecks returns the checks of rs's rules with the rules written in:
// check.lua once per rule, its rule's numbers as Lua constants (integers
// below 2^53, in decimal: Lua reads them exactly), instead of rules.lua's
// loop over the arguments. Redis then converts no rule number per call,
// the client sends none, and no loop or rule(i) call runs. With several
// rules, the checks nest, each holding its rule's first write until every
// rule has allowed (written.lua), instead of queueing it.
func writtenChecks(rs *ruleSet) string {
	var b strings.Builder
	several := len(rs.rules) > 1
	b.WriteString("-- The rules, written in by redlimit (see scripts.go).\n")
	b.WriteString("local counting = " + strconv.FormatBool(rs.counting) + "\n")
	if several {
		// written.lua's functions, made by the part that defines (see
		// heldFiles), hold each rule's first write.
		b.WriteString("wc, write = nil, held\n")
		if writesTwice(rs) {
			b.WriteString("write_args = held_args\n")
		}
	}
	for i := range rs.rules {
		r := &rs.rules[i]
		if several {
			b.WriteString("do local hc, hk, ha, hb, hx\n")
		}
		b.WriteString("do local i, strat, check, rate, period, burst, per_call = " + strconv.Itoa(i+1) + ", '" + r.code + "', check_" + r.alg.code)
		for _, v := range r.args[1:] { // rate, period, burst: as the arguments would carry them
			b.WriteString(", " + strconv.FormatInt(v.(int64), 10))
		}
		b.WriteString(", " + strconv.FormatBool(r.perCall) + "\n")
		b.WriteString("local pxs" + usualPX(r) + "\n")
		b.WriteString(mustRead("check.lua"))
		if several {
			b.WriteString("hc, hk, ha, hb, hx = wc, wk, wa, wb, wx\nwc = nil\n")
		}
		b.WriteString("end\n")
	}
	if several {
		if slices.ContainsFunc(rs.rules, func(r rule) bool { return r.alg.strategy == LeakyBucket }) {
			b.WriteString(mustRead("slots.lua")) // before the held writes: it may deny
		}
		for range rs.rules {
			b.WriteString(commitHeld)
		}
	}
	return b.String()
}

// heldFiles returns the files that define how a script with several rules
// written in holds their writes (see writtenChecks): queue.lua where a
// rule may write more than once, and written.lua. A Redis Function makes
// their functions once, in the part that defines (see bake).
func heldFiles(rs *ruleSet) []string {
	switch {
	case len(rs.rules) < 2:
		return nil
	case writesTwice(rs):
		return []string{"queue.lua", "written.lua"}
	}
	return []string{"written.lua"}
}

// writesTwice reports whether a rule of rs may write more than once in a
// call, or a command in a table (write_args): the sliding log and the
// sub-window counter, where a rule's first write is held and its others
// queue.
func writesTwice(rs *ruleSet) bool {
	return slices.ContainsFunc(rs.rules, func(r rule) bool {
		return r.alg.strategy == SlidingLog || r.alg.strategy == SubWindowCounter
	})
}

// strategyFilesOf returns the strategies' files that the rules need, each
// once, in the order of everyFile.
func strategyFilesOf(rules []rule) []string {
	var files []string
	for _, f := range everyFile {
		if slices.ContainsFunc(rules, func(r rule) bool { return fileOf(r.alg) == f }) {
			files = append(files, f)
		}
	}
	return files
}

// usualPX returns " = '<ms>'" to set pxs (see common.lua), the PX of one
// period of rule r as a string, where r's check takes one: a bucket, and a
// sliding log, whose PX is an expiry cell and a ms more (see
// slidinglog.lua's sl_cell); else "". The ms are common.lua's ms: rounded
// up.
func usualPX(r *rule) string {
	period := r.args[2].(int64) // µs, as the script's period
	var px int64
	switch {
	case r.alg.strategy == SlidingLog:
		px = (period+max(period/64, 1000)+999)/1000 + 1
	case r.alg.bucket:
		px = (period + 999) / 1000
	default:
		return ""
	}
	return " = '" + strconv.FormatInt(px, 10) + "'"
}
