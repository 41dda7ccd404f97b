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

// loadScript returns the named parts, concatenated, as one script. A
// decision script is common.lua, the strategies' parts, rules.lua and
// decide.lua, so that a decision is one EVALSHA of one self-contained
// script.
func loadScript(parts ...string) *redis.Script {
	var src strings.Builder
	for _, p := range parts {
		src.WriteString(mustRead(p))
	}
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
	parts := []string{mustRead("common.lua")}
	for _, file := range strategyFilesOf(rs.rules) {
		parts = append(parts, mustRead(file))
	}
	parts = append(parts, part, mustRead("decide.lua"))
	s := redis.NewScript(strings.Join(parts, ""))
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
		b.WriteString("  ")
		if i < len(rs.rules)-1 {
			b.WriteString("if i == " + strconv.Itoa(i+1) + " then ")
		}
		b.WriteString("return '" + r.alg.code + "', " +
			strconv.FormatInt(r.args[1].(int64), 10) + ", " +
			strconv.FormatInt(r.args[2].(int64), 10) + ", " +
			strconv.FormatInt(r.args[3].(int64), 10) + ", " +
			strconv.FormatBool(r.perCall))
		if i < len(rs.rules)-1 {
			b.WriteString(" end")
		}
		b.WriteString("\n")
	}
	b.WriteString("end\n")
	return b.String()
}

// strategyFilesOf returns the scripts/ parts that the rules' strategies
// need, each once, in a fixed order.
func strategyFilesOf(rules []rule) []string {
	var files []string
	for _, s := range Strategies() {
		file := strategyFiles[s]
		for i := range rules {
			if rules[i].alg.strategy == s && !slices.Contains(files, file) {
				files = append(files, file)
			}
		}
	}
	return files
}
