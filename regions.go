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

	"github.com/redlimit/redlimit/internal/hashslot"
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

	mu      sync.Mutex
	inbox   map[string]journal  // journals read, not yet taken by the peer's loop
	wake    chan struct{}       // a round handed the loop its inbox
	charged map[string]*ruleSet // keys this instance charged the peer's share on while it was silent

	pending map[string]journal // journals the peer has not had (its loop's)
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
	// A peer counts as heard until its first delivery's deadline: a first
	// delivery (a dial, the script's load) slower than the staleness
	// bound does not make it silent and charge it its share meanwhile.
	now := time.Now().Add(deliverTimeout(x.sync)).UnixNano()
	for _, name := range slices.Sorted(maps.Keys(r.Peers)) {
		p := &regionPeer{name: name, rdb: r.Peers[name], inbox: make(map[string]journal), pending: make(map[string]journal), wake: make(chan struct{}, 1), charged: make(map[string]*ruleSet)}
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
		out[p.name] = time.Duration(max(now-p.heard.Load(), 0))
	}
	return out
}

// close stops the loops. It does not wait for a delivery in flight, which
// may hang on a peer's link until its timeout (a client reading with a
// deadline does not see its context canceled): that loop ends then.
func (x *exchange) close() { x.stop() }

// loop reads, every interval, the journals of the keys decided since
// (once for every peer), hands them to every peer's loop, and charges the
// silent peers their shares.
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
		ctx, cancel := context.WithTimeout(x.ctx, x.sync)
		journals, err := x.readJournals(ctx, active)
		if err != nil {
			// This region's Redis could not give them: the keys wait for
			// the next round.
			x.mu.Lock()
			for s, rs := range active {
				x.active[s] = rs
			}
			x.mu.Unlock()
		}
		for _, p := range x.peers {
			p.mu.Lock()
			for s, j := range journals {
				if _, ok := p.inbox[s]; ok || len(p.inbox) < maxRegionPending {
					p.inbox[s] = j
				}
			}
			p.mu.Unlock()
			select {
			case p.wake <- struct{}{}:
			default: // its loop is busy delivering: it takes the inbox next
			}
		}
		x.assume(ctx, active)
		cancel()
	}
}

// peerLoop delivers to p, as soon as each round hands them over, the
// journals read since (and those a failed delivery left).
func (x *exchange) peerLoop(p *regionPeer) {
	// The script loaded ahead, so that the first delivery is one round
	// trip (a failure here is met by the deliveries' own load).
	ctx, cancel := context.WithTimeout(x.ctx, deliverTimeout(x.sync))
	_ = regionScript.Load(ctx, p.rdb).Err()
	cancel()
	failed := false // the last delivery failed: what it left is as read then
	for tick := 0; ; tick++ {
		select {
		case <-x.ctx.Done():
			return
		case <-p.wake:
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
		fresh := len(p.inbox)
		for s, j := range p.inbox {
			if _, ok := p.pending[s]; ok || len(p.pending) < maxRegionPending {
				p.pending[s] = j
			}
		}
		clear(p.inbox)
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(x.ctx, deliverTimeout(x.sync))
		err := error(nil)
		if failed && len(p.pending) > fresh {
			err = x.refresh(ctx, p)
		}
		if err == nil {
			err = x.deliver(ctx, p)
		}
		if failed = err != nil; !failed {
			p.heard.Store(time.Now().UnixNano())
			x.reconcile(ctx, p)
		}
		cancel()
	}
}

// reconcile sets the share this instance charged p while it was silent
// against p's usage, once p is heard again: it reads p's journals of those
// keys from p's Redis and applies them to this region's, as p's own
// delivery would (and it may come too: applied once); a key p has no
// journal of had no usage there, and its share is given back. Without
// this, a peer that admitted nothing during the silence (so delivers
// nothing) would leave its share charged here for good.
func (x *exchange) reconcile(ctx context.Context, p *regionPeer) {
	p.mu.Lock()
	keys := p.charged
	if len(keys) == 0 {
		p.mu.Unlock()
		return
	}
	p.charged = make(map[string]*ruleSet)
	p.mu.Unlock()
	states := slices.Collect(maps.Keys(keys))
	cmds := make([]*redis.StringCmd, len(states))
	_, err := p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, s := range states {
			cmds[i] = pipe.Get(ctx, x.journalKey(s, keys[s]))
		}
		return nil
	})
	if err == nil || errors.Is(err, redis.Nil) {
		used, unused := make(map[string]journal), make(map[string]*ruleSet)
		for i, s := range states {
			if j, ok := parseJournal(cmds[i].Val()); ok {
				used[s] = journal{rs: keys[s], j: j}
			} else {
				unused[s] = keys[s]
			}
		}
		err = runScript(ctx, x.e.rdb, func(pipe redis.Pipeliner) {
			x.queueJournals(ctx, pipe, x.e.rdb, p.name, used)
			for _, states := range batches(x.e.rdb, unused, func(rs *ruleSet) *ruleSet { return rs }) {
				keys, args := x.applyArgs(unused[states[0]], p.name, "z", states, nil)
				regionScript.EvalSha(ctx, pipe, keys, args...)
			}
		})
	}
	if err != nil { // the next round tries again
		p.mu.Lock()
		maps.Copy(p.charged, keys)
		p.mu.Unlock()
	}
}

// refresh reads again, once p answers a PING, the journals that a failed
// delivery left as they were read then (when some were not read again by
// this round, for keys decided since): applied after a silence, a journal
// older than the region's usage would set only part of it against the
// share charged for the whole silence, and give back too much, lost where
// the state has less to give (a bucket full again).
func (x *exchange) refresh(ctx context.Context, p *regionPeer) error {
	if err := p.rdb.Ping(ctx).Err(); err != nil || len(p.pending) == 0 {
		return err
	}
	keys := make(map[string]*ruleSet, len(p.pending))
	for s, j := range p.pending {
		keys[s] = j.rs
	}
	journals, err := x.readJournals(ctx, keys)
	if err != nil {
		return err
	}
	maps.Copy(p.pending, journals) // a journal gone since (its life over) is sent as read
	return nil
}

// journal is a key's journal as read from this region's Redis (see
// scripts/region.lua), with the key's rules.
type journal struct {
	rs *ruleSet
	j  [7]int64 // e, c, k, t, pe, pc, pk
}

// readJournals returns the journals of keys, by first state key, from
// this region's Redis; a key without one (nothing admitted) is left out.
func (x *exchange) readJournals(ctx context.Context, keys map[string]*ruleSet) (map[string]journal, error) {
	out := make(map[string]journal, len(keys))
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
			if j, ok := parseJournal(v); ok {
				out[s] = journal{rs: keys[s], j: j}
			}
		}
	}
	return out, nil
}

// maxRegionBatch is the most keys one call of regionScript applies.
const maxRegionBatch = 64

// batches groups states, each with its rules, into batches of at most
// maxRegionBatch keys of the same rules (and, for a client that spreads
// keys over servers, in the same slot): one call each.
func batches[V any](rdb redis.UniversalClient, states map[string]V, rsOf func(V) *ruleSet) [][]string {
	_, one := rdb.(*redis.Client) // one server: any keys in one call
	type group struct {
		slot int
		rs   *ruleSet
	}
	by := make(map[group][]string)
	for s, v := range states {
		g := group{rs: rsOf(v)}
		if !one {
			g.slot = hashslot.Of(s)
		}
		by[g] = append(by[g], s)
	}
	var out [][]string
	for _, ss := range by {
		slices.Sort(ss)
		for len(ss) > maxRegionBatch {
			out = append(out, ss[:maxRegionBatch])
			ss = ss[maxRegionBatch:]
		}
		out = append(out, ss)
	}
	return out
}

// deliver applies the journals p has not had to p's Redis, a batch of
// keys per call, in one round trip (a PING when there are none, so that a
// quiet limiter still hears its peers), and forgets them once applied.
func (x *exchange) deliver(ctx context.Context, p *regionPeer) error {
	if len(p.pending) == 0 {
		return p.rdb.Ping(ctx).Err()
	}
	err := runScript(ctx, p.rdb, func(pipe redis.Pipeliner) {
		x.queueJournals(ctx, pipe, p.rdb, x.name, p.pending)
	})
	if err == nil {
		clear(p.pending)
	}
	return err
}

// queueJournals queues on pipe, for rdb, the calls of the region script
// that apply journals, origin's, a batch of keys per call.
func (x *exchange) queueJournals(ctx context.Context, pipe redis.Pipeliner, rdb redis.UniversalClient, origin string, journals map[string]journal) {
	for _, states := range batches(rdb, journals, func(j journal) *ruleSet { return j.rs }) {
		tail := make([]int64, 0, len(states)*len(journal{}.j))
		for _, s := range states {
			j := journals[s].j
			tail = append(tail, j[:]...)
		}
		keys, args := x.applyArgs(journals[states[0]].rs, origin, "u", states, tail)
		regionScript.EvalSha(ctx, pipe, keys, args...)
	}
}

// runScript runs the region script's calls that queue makes in one
// pipeline on rdb, loading the script and running them again if rdb did
// not have it.
func runScript(ctx context.Context, rdb redis.UniversalClient, queue func(redis.Pipeliner)) error {
	run := func() ([]redis.Cmder, error) {
		return rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			queue(pipe)
			return nil
		})
	}
	cmds, err := run()
	if err != nil && isNoScript(cmds) {
		if err = regionScript.Load(ctx, rdb).Err(); err == nil {
			_, err = run()
		}
	}
	return err
}

// assume charges each peer silent past the staleness bound its share of
// the limit, on this region's Redis, for the keys decided this round: a
// peer that cannot be heard is taken to spend its share, not nothing.
func (x *exchange) assume(ctx context.Context, active map[string]*ruleSet) {
	bound := staleSyncs * x.sync
	now := time.Now()
	silent := false
	var groups [][]string
	for _, p := range x.peers {
		heard := time.Unix(0, p.heard.Load())
		if now.Sub(heard) <= bound {
			continue
		}
		silent = true
		if len(active) == 0 {
			continue
		}
		if groups == nil {
			groups = batches(x.e.rdb, active, func(rs *ruleSet) *ruleSet { return rs })
		}
		p.mu.Lock()
		for s, rs := range active {
			if _, ok := p.charged[s]; ok || len(p.charged) < maxRegionPending {
				p.charged[s] = rs
			}
		}
		p.mu.Unlock()
		since := heard.UnixMicro() + x.e.serverAhead.Load()
		_ = runScript(ctx, x.e.rdb, func(pipe redis.Pipeliner) {
			for _, states := range groups {
				keys, args := x.applyArgs(active[states[0]], p.name, "a", states, []int64{since})
				regionScript.EvalSha(ctx, pipe, keys, args...)
			}
		})
	}
	x.silent.Store(silent)
}

// applyArgs returns the keys and arguments of regionScript for the keys
// whose first state keys are states, under rs, for the region named peer
// (this one, delivering its journals; a silent peer, charged its share):
// mode and tail, its arguments (see scripts/region_apply.lua).
func (x *exchange) applyArgs(rs *ruleSet, peer, mode string, states []string, tail []int64) ([]string, []any) {
	keys := make([]string, 0, len(states)*(len(rs.rules)+1))
	for _, s := range states {
		for i := range rs.rules {
			keys = append(keys, ruleKey(s, rs, i))
		}
		keys = append(keys, regionKey(s, rs, peersSuffix))
	}
	args := make([]any, 0, 7+4*len(rs.rules)+4+len(tail))
	args = append(args, 0, len(rs.rules), argZero, argNoMaxDelay, argZero, argNoRID, argZero)
	args = appendRuleArgs(args, rs, x.e.calendarNow(argZero))
	args = append(args, peer, mode, x.share, int64(x.life(rs)/time.Microsecond), int64(staleSyncs*x.sync/time.Microsecond))
	for _, v := range tail {
		args = append(args, v)
	}
	return keys, args
}

// journalKey returns the journal key of the key whose first state key is
// state, under rs: after ":j", 1e11 + its life in ms, 12 digits (see
// scripts/region.lua).
func (x *exchange) journalKey(state string, rs *ruleSet) string {
	return regionKey(state, rs, ":j"+strconv.FormatInt(1e11+x.life(rs).Milliseconds(), 10))
}

// life returns how long a journal of rs lives after its last admission,
// and an epoch of it at most: as long as rs's rules remember an event, at
// least ten exchange intervals, at most maxJournalLife.
func (x *exchange) life(rs *ruleSet) time.Duration {
	return min(max(horizon(rs), 10*x.sync), maxJournalLife)
}

// maxJournalLife bounds a journal's life (a bucket whose refill takes
// years): 11 digits of ms in its key.
const maxJournalLife = 366 * 24 * time.Hour

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
