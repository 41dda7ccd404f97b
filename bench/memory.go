package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redlimit/redlimit"
)

// MemoryRow is what one limiter keeps in Redis for one limited key.
type MemoryRow struct {
	Contender string
	Events    int      // allowed decisions made on the key
	Keys      []string // "name (type, encoding, TTL)" of each Redis key made
	Bytes     int64    // sum of MEMORY USAGE <key> SAMPLES 0
	// PerKey is used_memory's growth per limited key after one allowed
	// decision on each of MemoryReport.NumKeys keys: what a key costs in practice,
	// with the key dictionaries' and expiry table's share (0 when not
	// measured).
	PerKey float64
}

// MemoryReport is the outcome of Memory.
type MemoryReport struct {
	Rows    []MemoryRow
	NumKeys int
	Version string
}

// MemoryKeys is how many limited keys the used_memory figure is taken over
// by default.
const MemoryKeys = 10_000

// Memory measures, with MEMORY USAGE, the Redis memory each strategy and peer
// keeps per limited key after one allowed decision (and, for the sliding
// log, after 1, 10, 100 and 1000), and the growth of used_memory over
// numKeys keys (MemoryKeys when 0). It needs redis-server: miniredis has no
// MEMORY USAGE.
func Memory(ctx context.Context, env *Env, numKeys int) (*MemoryReport, error) {
	if numKeys <= 0 {
		numKeys = MemoryKeys
	}
	rep := &MemoryReport{NumKeys: numKeys}
	// 10 per minute: every key outlives the measurement (a GCRA key lives
	// one emission interval, 6 s here). go-zero's TokenLimiter takes whole
	// events per second, so it gets 1/s with a burst of 10.
	w := &Workload{Name: "memory", Keys: []string{"m"}, Rate: 10, Period: time.Minute}
	cs := Contenders()
	for _, c := range cs {
		if c.Name == "EVALSHA return 1" {
			continue
		}
		row, err := memoryOne(ctx, env, c, w, 1)
		if err != nil {
			return nil, fmt.Errorf("bench: memory of %s: %w", c.Name, err)
		}
		per, err := memoryMany(ctx, env, c, w, numKeys)
		if err != nil {
			return nil, fmt.Errorf("bench: memory of %s over %d keys: %w", c.Name, numKeys, err)
		}
		row.PerKey = per
		rep.Rows = append(rep.Rows, row)
	}
	log := &Workload{Name: "memory", Keys: []string{"m"}, Rate: 10_000, Period: time.Minute}
	for _, n := range []int{1, 10, 100, 1000} {
		row, err := memoryOne(ctx, env, Redlimit(redlimit.SlidingLog, Direct), log, n)
		if err != nil {
			return nil, err
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

func goZeroSafe(w *Workload) *Workload {
	if w.Rate*int(time.Second)/int(w.Period) >= 1 {
		return w
	}
	c := *w
	c.Rate, c.Period = 10, 10*time.Second // 1 per second, burst 10
	return &c
}

// memoryOne makes events allowed decisions on one key of an empty database
// and sums MEMORY USAGE over every key that appeared.
func memoryOne(ctx context.Context, env *Env, c Contender, w *Workload, events int) (MemoryRow, error) {
	row := MemoryRow{Contender: c.Name, Events: events}
	if strings.HasPrefix(c.Name, "go-zero TokenLimiter") {
		w = goZeroSafe(w)
	}
	if err := env.Admin.FlushAll(ctx).Err(); err != nil {
		return row, err
	}
	dec, release, err := c.Setup(env, w)
	if err != nil {
		return row, err
	}
	if release != nil {
		defer release()
	}
	if err := env.Admin.ScriptFlush(ctx).Err(); err != nil { // keep the script cache out of used_memory
		return row, err
	}
	for range events {
		ok, err := dec(ctx, 0)
		if err != nil {
			return row, err
		}
		if !ok {
			return row, fmt.Errorf("a decision was denied")
		}
	}
	keys, err := env.Admin.Keys(ctx, "*").Result()
	if err != nil {
		return row, err
	}
	slices.Sort(keys)
	for _, k := range keys {
		n, err := env.Admin.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			return row, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
		}
		typ, _ := env.Admin.Type(ctx, k).Result()
		enc, _ := env.Admin.ObjectEncoding(ctx, k).Result()
		ttl, _ := env.Admin.PTTL(ctx, k).Result()
		row.Bytes += n
		ttlText := "no TTL"
		if ttl >= 0 {
			ttlText = "TTL " + ttl.Round(time.Millisecond).String()
		}
		row.Keys = append(row.Keys, fmt.Sprintf("`%s` (%s, %s, %s)", k, typ, enc, ttlText))
	}
	if len(keys) == 0 {
		return row, fmt.Errorf("no key left after %d decisions", events)
	}
	return row, nil
}

// fill makes one decision on each of numKeys keys, from 8 goroutines, and
// returns the first goroutine's error.
func fill(ctx context.Context, dec Decider, numKeys int) error {
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := g; i < numKeys; i += 8 {
				if _, err := dec(ctx, i); err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// memoryMany returns used_memory's growth per limited key after one allowed
// decision on each of numKeys keys.
func memoryMany(ctx context.Context, env *Env, c Contender, w *Workload, numKeys int) (float64, error) {
	if strings.HasPrefix(c.Name, "go-zero TokenLimiter") {
		w = goZeroSafe(w)
	}
	many := *w
	many.Keys = make([]string, numKeys)
	for i := range many.Keys {
		many.Keys[i] = "user:" + strconv.Itoa(i)
	}
	return measureMany(ctx, env, c, &many)
}

// measureMany returns used_memory's growth per key of w after one allowed
// decision on each, measured again (twice at most) when keys were dropped
// meanwhile.
func measureMany(ctx context.Context, env *Env, c Contender, w *Workload) (float64, error) {
	numKeys := len(w.Keys)
	for attempt := 0; ; attempt++ {
		if err := env.Admin.FlushAll(ctx).Err(); err != nil {
			return 0, err
		}
		dec, release, err := c.Setup(env, w)
		if err != nil {
			return 0, err
		}
		// One decision on another key loads the script, so that the script
		// cache does not count; then a quiet moment for the allocator.
		if _, err := dec(ctx, 0); err != nil {
			return 0, err
		}
		if err := env.Admin.FlushAll(ctx).Err(); err != nil {
			return 0, err
		}
		before, err := usedMemory(ctx, env)
		if err != nil {
			return 0, err
		}
		err = fill(ctx, dec, numKeys)
		if release != nil {
			release()
		}
		if err != nil {
			return 0, err
		}
		after, err := usedMemory(ctx, env)
		if err != nil {
			return 0, err
		}
		// A fixed window aligned to the minute may have ended during the
		// fill, dropping keys: then measure again.
		n, err := env.Admin.DBSize(ctx).Result()
		if err != nil {
			return 0, err
		}
		if n < int64(numKeys) && attempt < 2 {
			continue
		}
		if n < int64(numKeys) {
			return 0, fmt.Errorf("only %d keys left", n)
		}
		return float64(after-before) / float64(numKeys), nil
	}
}

func usedMemory(ctx context.Context, env *Env) (int64, error) {
	info, err := env.Admin.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory in INFO memory")
}

// Markdown writes the report.
func (r *MemoryReport) Markdown(w io.Writer) {
	fmt.Fprintf(w, "### Redis memory per limited key\n\n")
	fmt.Fprintf(w, "MEMORY USAGE (SAMPLES 0, summed over the key's Redis keys) after the given number of allowed decisions on one key; "+
		"used_memory/key: growth of INFO used_memory over %d keys with one allowed decision each, divided by %d "+
		"(includes the main and expires dictionaries' share). Limit 10/min (go-zero TokenLimiter: 1/s, burst 10; "+
		"sliding log rows: 10000/min).\n\n", r.NumKeys, r.NumKeys)
	fmt.Fprintf(w, "| contender | events | MEMORY USAGE (B) | used_memory/key (B) | Redis keys |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---|\n")
	for _, row := range r.Rows {
		per := "–"
		if row.PerKey != 0 {
			per = fmt.Sprintf("%.0f", row.PerKey)
		}
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s |\n", row.Contender, row.Events, row.Bytes, per, strings.Join(row.Keys, "<br>"))
	}
	fmt.Fprintln(w)
}
