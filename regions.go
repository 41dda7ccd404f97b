package redlimit

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Regions shares one limit across regions, each deciding on its own Redis
// (see [WithRegions] and docs/regions.md).
type Regions struct {
	// Name is this region's name, as its peers know it.
	Name string
	// Peers are the other regions' Redis clients, by region name.
	Peers map[string]redis.UniversalClient
	// Sync is the exchange interval: what a region admits reaches its
	// peers within Sync and a round trip. 0 means DefaultRegionSync.
	Sync time.Duration
}

// DefaultRegionSync is the exchange interval of a zero [Regions.Sync].
const DefaultRegionSync = 200 * time.Millisecond

// staleSyncs is the staleness bound in exchange intervals: a peer not
// reached for that long is silent, and charged its share (see
// exchange.assume).
const staleSyncs = 4

// maxRegionPending bounds the keys one peer has yet to be told of; past it
// a key's usage waits for the key's next decision.
const maxRegionPending = 1 << 20

// peersSuffix ends the key of what the key's peers' journals applied
// (scripts/region_apply.lua); a journal's key ends in ":j" and its life
// (journalKey).
const peersSuffix = ":p"

// regionScript applies a peer's journal, or a silent peer's share, to a
// key's rules (see scripts/region_apply.lua).
var regionScript = redis.NewScript(decisionHead(calendarFiles) +
	readScripts("args.lua", "rules.lua", "adjust.lua", "region_apply.lua"))

// check says why r cannot share rules across regions, or returns nil.
func (r *Regions) check(rules []rule) error {
	bad := func(format string, args ...any) error {
		return errorf("WithRegions: %s: %w", fmt.Sprintf(format, args...), ErrInvalidArgument)
	}
	switch {
	case r.Name == "":
		return bad("empty region name")
	case len(r.Peers) == 0:
		return bad("region %q has no peers", r.Name)
	case r.Sync < 0:
		return bad("exchange interval %v must not be negative", r.Sync)
	}
	for name, rdb := range r.Peers {
		switch {
		case name == "":
			return bad("a peer with an empty name")
		case name == r.Name:
			return bad("peer %q is this region", name)
		case isNilClient(rdb):
			return bad("peer %q has a nil Redis client", name)
		}
	}
	for i := range rules {
		if rules[i].alg.strategy == SlidingLog {
			return errorf("WithRegions: a sliding log's timestamps do not add up across regions (use a sliding counter or a sub-window counter): %w", ErrInvalidLimit)
		}
	}
	return nil
}

// exchange tells a limiter's peer regions what its region admitted, in the
// background: every Sync, for each key decided since, it reads the key's
// journal and applies it to each peer's Redis (regionScript), and charges
// each peer silent past the staleness bound its share on this region's
// Redis. Every instance runs one; the journals make a repeat harmless.
type exchange struct {
	e      *engine
	name   string
	peers  []*regionPeer
	sync   time.Duration
	share  int64 // a region's share of the limit, ppm
	silent atomic.Bool

	mu     sync.Mutex
	active map[string]*ruleSet // keys decided since the last round

	ctx  context.Context // the loops': done when the limiter closes
	stop context.CancelFunc
}

// regionPeer is one peer region, as this instance's exchange sees it. Each
// has its own loop, so that a peer that hangs delays no other.
type regionPeer struct {
	name  string
	rdb   redis.UniversalClient
	heard atomic.Int64 // when its loop last reached the peer (UnixNano)

	mu    sync.Mutex
	inbox map[string]*ruleSet // keys decided, not yet taken by the peer's loop

	pending map[string]*ruleSet // keys whose journals the peer has not had (its loop's)
}

// deliverTimeout bounds one delivery to a peer: a new connection's
// handshake, the journals and, after a restart of the peer's Redis, the
// script's load, over a link of the round trip of a distant region.
func deliverTimeout(sync time.Duration) time.Duration { return max(2*sync, time.Second) }

func newExchange(e *engine, r *Regions) *exchange {
	x := &exchange{
		e: e, name: r.Name, sync: r.Sync,
		share:  1_000_000 / int64(len(r.Peers)+1),
		active: make(map[string]*ruleSet),
	}
	x.ctx, x.stop = context.WithCancel(context.Background())
	if x.sync == 0 {
		x.sync = DefaultRegionSync
	}
	now := time.Now().UnixNano()
	for _, name := range slices.Sorted(maps.Keys(r.Peers)) {
		p := &regionPeer{name: name, rdb: r.Peers[name], inbox: make(map[string]*ruleSet), pending: make(map[string]*ruleSet)}
		p.heard.Store(now)
		x.peers = append(x.peers, p)
	}
	go x.loop()
	for _, p := range x.peers {
		go x.peerLoop(p)
	}
	return x
}

// note records that Redis decided the key whose first state key is state.
func (x *exchange) note(state string, rs *ruleSet) {
	x.mu.Lock()
	x.active[state] = rs
	x.mu.Unlock()
}

// stale reports whether a peer has been silent past the staleness bound.
func (x *exchange) stale() bool { return x.silent.Load() }

// ages returns how long ago this instance last reached each peer.
func (x *exchange) ages() map[string]time.Duration {
	now := time.Now().UnixNano()
	out := make(map[string]time.Duration, len(x.peers))
	for _, p := range x.peers {
		out[p.name] = time.Duration(now - p.heard.Load())
	}
	return out
}

// close stops the loops. It does not wait for a delivery in flight, which
// may hang on a peer's link until its timeout (a client reading with a
// deadline does not see its context canceled): that loop ends then.
func (x *exchange) close() { x.stop() }

// loop hands the keys decided in each interval to every peer's loop, and
// charges the silent peers their shares.
func (x *exchange) loop() {
	t := time.NewTicker(x.sync)
	defer t.Stop()
	for {
		select {
		case <-x.ctx.Done():
			return
		case <-t.C:
		}
		x.mu.Lock()
		active := x.active
		x.active = make(map[string]*ruleSet, len(active))
		x.mu.Unlock()
		for _, p := range x.peers {
			p.mu.Lock()
			for k, rs := range active {
				if len(p.inbox) < maxRegionPending {
					p.inbox[k] = rs
				}
			}
			p.mu.Unlock()
		}
		ctx, cancel := context.WithTimeout(x.ctx, x.sync)
		x.assume(ctx, active)
		cancel()
	}
}

// peerLoop delivers, every interval, the journals of the keys decided
// since (and of those a failed delivery left) to p.
func (x *exchange) peerLoop(p *regionPeer) {
	t := time.NewTicker(x.sync)
	defer t.Stop()
	for tick := 0; ; tick++ {
		select {
		case <-x.ctx.Done():
			return
		case <-t.C:
		}
		// A silent peer is tried every other interval: go-redis's pool
		// stops dialing after PoolSize dial errors in a row and then dials
		// once a second, which would add up to a second to a heal. So a
		// partition of up to 2 x PoolSize intervals (8 s at the defaults,
		// with a pool of 20) heals within two intervals and a delivery.
		if tick%2 == 1 && time.Since(time.Unix(0, p.heard.Load())) > staleSyncs*x.sync {
			continue
		}
		p.mu.Lock()
		for k, rs := range p.inbox {
			if len(p.pending) < maxRegionPending {
				p.pending[k] = rs
			}
		}
		clear(p.inbox)
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(x.ctx, deliverTimeout(x.sync))
		// A journal this region's Redis could not give waits for the next
		// round: the peer is not heard meanwhile.
		if journals, err := x.readJournals(ctx, p.pending); err == nil && x.deliver(ctx, p, journals) == nil {
			p.heard.Store(time.Now().UnixNano())
		}
		cancel()
	}
}

// readJournals returns the journals of keys, by first state key, from
// this region's Redis; a key without one (nothing admitted) is left out.
func (x *exchange) readJournals(ctx context.Context, keys map[string]*ruleSet) (map[string]string, error) {
	out := make(map[string]string, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	states := slices.Collect(maps.Keys(keys))
	cmds := make([]*redis.StringCmd, len(states))
	_, err := x.e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, s := range states {
			cmds[i] = p.Get(ctx, x.journalKey(s, keys[s]))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	for i, s := range states {
		if v, err := cmds[i].Result(); err == nil {
			out[s] = v
		}
	}
	return out, nil
}

// deliver applies the journals of the keys p has not had to p's Redis
// (a PING when there are none, so that a quiet limiter still hears its
// peers), and forgets the keys it applied.
func (x *exchange) deliver(ctx context.Context, p *regionPeer, journals map[string]string) error {
	var states []string
	for s := range p.pending {
		if _, ok := journals[s]; ok {
			states = append(states, s)
		} else {
			delete(p.pending, s) // nothing admitted: nothing to tell
		}
	}
	if len(states) == 0 {
		return p.rdb.Ping(ctx).Err()
	}
	run := func() ([]redis.Cmder, error) {
		return p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, s := range states {
				j, ok := parseJournal(journals[s])
				if !ok {
					continue
				}
				keys, args := x.applyArgs(s, p.pending[s], x.name, "u", j[:]...)
				regionScript.EvalSha(ctx, pipe, keys, args...)
			}
			return nil
		})
	}
	cmds, err := run()
	if err != nil && isNoScript(cmds) {
		if err = regionScript.Load(ctx, p.rdb).Err(); err == nil {
			cmds, err = run()
		}
	}
	if err != nil {
		return err
	}
	for _, s := range states {
		delete(p.pending, s)
	}
	return nil
}

// assume charges each peer silent past the staleness bound its share of
// the limit, on this region's Redis, for the keys decided this round: a
// peer that cannot be heard is taken to spend its share, not nothing.
func (x *exchange) assume(ctx context.Context, active map[string]*ruleSet) {
	bound := staleSyncs * x.sync
	now := time.Now()
	silent := false
	for _, p := range x.peers {
		heard := time.Unix(0, p.heard.Load())
		if now.Sub(heard) <= bound {
			continue
		}
		silent = true
		if len(active) == 0 {
			continue
		}
		since := heard.UnixMicro() + x.e.serverAhead.Load()
		run := func() ([]redis.Cmder, error) {
			return x.e.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				for s, rs := range active {
					keys, args := x.applyArgs(s, rs, p.name, "a", since)
					regionScript.EvalSha(ctx, pipe, keys, args...)
				}
				return nil
			})
		}
		if cmds, err := run(); err != nil && isNoScript(cmds) {
			if regionScript.Load(ctx, x.e.rdb).Err() == nil {
				_, _ = run()
			}
		}
	}
	x.silent.Store(silent)
}

// applyArgs returns the keys and arguments of regionScript for the key
// whose first state key is state, under rs, for the region named peer
// (this one, delivering its journal; a silent peer, charged its share): mode and its
// arguments (see scripts/region_apply.lua).
func (x *exchange) applyArgs(state string, rs *ruleSet, peer, mode string, more ...int64) ([]string, []any) {
	keys := make([]string, 0, len(rs.rules)+1)
	for i := range rs.rules {
		keys = append(keys, ruleKey(state, rs, i))
	}
	keys = append(keys, regionKey(state, rs, peersSuffix))
	args := make([]any, 0, 7+4*len(rs.rules)+4+len(more))
	args = append(args, 0, len(rs.rules), argZero, argNoMaxDelay, argZero, argNoRID, argZero)
	args = appendRuleArgs(args, rs, x.e.calendarNow(argZero))
	args = append(args, peer, mode)
	for _, v := range more {
		args = append(args, v)
	}
	return keys, append(args, x.share, int64(x.life(rs)/time.Microsecond))
}

// journalKey returns the journal key of the key whose first state key is
// state, under rs: its life, in ms, after ":j" (see scripts/region.lua).
func (x *exchange) journalKey(state string, rs *ruleSet) string {
	return regionKey(state, rs, ":j"+strconv.FormatInt(x.life(rs).Milliseconds(), 10))
}

// life returns how long a journal of rs lives after its last admission,
// and an epoch of it at most: as long as rs's rules remember an event, and
// at least ten exchange intervals.
func (x *exchange) life(rs *ruleSet) time.Duration { return max(horizon(rs), 10*x.sync) }

// horizon returns how long the longest of rs's rules remembers an event: a
// bucket until it is full again, a window its length (a sliding counter's
// two, a calendar quota's the longest of its windows).
func horizon(rs *ruleSet) time.Duration {
	var h time.Duration
	for i := range rs.rules {
		l := &rs.rules[i].limit
		d := 2 * l.Period
		if l.Burst > l.Rate && l.Rate > 0 {
			d = time.Duration(float64(l.Period) * float64(l.Burst) / float64(l.Rate))
		}
		if l.isCalendar() {
			d = 31 * 24 * time.Hour
		}
		h = max(h, d)
	}
	return h.Truncate(time.Millisecond) + time.Millisecond
}

// regionKey returns a key's journal (journalSuffix) or peer record
// (peersSuffix) under rs, from its first state key: beside the penalty
// block key, in the key's slot.
func regionKey(first string, rs *ruleSet, suffix string) string {
	return blockKeyOf(first, rs) + suffix
}

// parseJournal reads a journal, "e:c:k:t:pe:pc:pk" (see
// scripts/region.lua).
func parseJournal(v string) (j [7]int64, ok bool) {
	parts := strings.Split(v, ":")
	if len(parts) != len(j) {
		return j, false
	}
	for i, p := range parts {
		var err error
		if j[i], err = strconv.ParseInt(p, 10, 64); err != nil {
			return j, false
		}
	}
	return j, true
}

// isNoScript reports whether a pipeline's commands failed for a script
// the server does not have.
func isNoScript(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			return true
		}
	}
	return false
}

// regionStage marks a decision made while a peer region was silent past
// the staleness bound (Result.Stale).
func (e *engine) regionStage(r *request, next decider) error {
	err := next(r)
	if err == nil && e.regions.stale() {
		r.res.Stale = true
	}
	return err
}

// PeerAges returns, with WithRegions, how long ago this instance's
// exchange last reached each peer region, by name; nil without.
func (e *engine) PeerAges() map[string]time.Duration {
	if e.regions == nil {
		return nil
	}
	return e.regions.ages()
}
