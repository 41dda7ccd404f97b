package redlimit

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

//go:embed scripts/*.lua
var scriptFS embed.FS

// loadScript returns the named parts, concatenated, as one script. A
// decision script is common.lua, the strategies' parts and decide.lua, so
// that a decision is one EVALSHA of one self-contained script.
func loadScript(parts ...string) *redis.Script {
	src := ""
	for _, p := range parts {
		src += mustRead(p)
	}
	return redis.NewScript(src)
}

func mustRead(name string) string {
	b, err := scriptFS.ReadFile("scripts/" + name)
	if err != nil {
		panic("redlimit: missing embedded script " + name) // the build embeds them all
	}
	return string(b)
}
