package redlimit

import (
	"embed"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// loadScript returns the named parts, concatenated, as one script.
func loadScript(parts ...string) *redis.Script {
	var src strings.Builder
	for _, p := range parts {
		src.WriteString(mustRead(p))
	}
	return redis.NewScript(src.String())
}

// decisionScript returns a decision script: common.lua, the strategies'
// files, the rules' part (rules.lua, or the rules written in) and
// decide.lua, so that a decision is one EVALSHA of one self-contained
// script.
func decisionScript(files []string, rules string) *redis.Script {
	var src strings.Builder
	src.WriteString(mustRead("common.lua"))
	for _, f := range files {
		src.WriteString(mustRead(f))
	}
	src.WriteString(rules)
	src.WriteString(mustRead("decide.lua"))
	return redis.NewScript(src.String())
}

func mustRead(name string) string {
	b, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("redlimit: missing embedded script " + name) // the build embeds them all
	}
	return string(b)
}

// maxBakedScripts bounds the scripts with rules written in that one
// process makes, and so what its limiters can add to Redis's script cache,
// which Redis before 7.4 never evicts. Limiters made past it pass their
// rules as arguments, as limits from WithLimitFunc always do. (A variable
// for the tests.)
var maxBakedScripts = 128

// baked holds the scripts with rules written in, by their rules' part.
var baked struct {
	sync.Mutex
	m map[string]*redis.Script
}

// bakedScript returns the decision script with the rules of rs written in
// (see scripts/rules.lua), or nil when maxBakedScripts are made already.
// Limiters with the same rules share one.
func bakedScript(rs *ruleSet) *redis.Script {
	part := bakedRules(rs)
	baked.Lock()
	defer baked.Unlock()
	if s, ok := baked.m[part]; ok {
		return s
	}
	if len(baked.m) >= maxBakedScripts {
		return nil
	}
	s := decisionScript(strategyFilesOf(rs.rules), part)
	if baked.m == nil {
		baked.m = make(map[string]*redis.Script)
	}
	baked.m[part] = s
	return s
}

// bakedRules returns the Lua that defines what scripts/rules.lua defines,
// with rs's rules as constants. The numbers are integers below 2^53,
// written in decimal: Lua reads them exactly.
func bakedRules(rs *ruleSet) string {
	var b strings.Builder
	b.WriteString("-- The rules, written in by redlimit (see rules.lua).\n")
	b.WriteString("local counting = " + strconv.FormatBool(rs.counting) + "\n")
	b.WriteString("local function rule(i)\n")
	for i := range rs.rules {
		r := &rs.rules[i]
		last := i == len(rs.rules)-1
		b.WriteString("  ")
		if !last {
			b.WriteString("if i == " + strconv.Itoa(i+1) + " then ")
		}
		b.WriteString("return '" + r.alg.code + "'")
		for _, v := range r.args[1:] { // rate, period, burst: as the arguments would carry them
			b.WriteString(", " + strconv.FormatInt(v.(int64), 10))
		}
		b.WriteString(", " + strconv.FormatBool(r.perCall))
		if !last {
			b.WriteString(" end")
		}
		b.WriteString("\n")
	}
	b.WriteString("end\n")
	return b.String()
}

// strategyFilesOf returns the strategies' files that the rules need, each
// once, in the order of allStrategyFiles.
func strategyFilesOf(rules []rule) []string {
	var files []string
	for _, f := range allStrategyFiles {
		if slices.ContainsFunc(rules, func(r rule) bool { return strategyFiles[r.alg.strategy] == f }) {
			files = append(files, f)
		}
	}
	return files
}
