package main

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"time"
)

// config is one simulated deployment and its traffic.
type config struct {
	regions, instances, keys int // keys: the keys simulated (a sample of the active ones)
	sync                     time.Duration
	rtt                      time.Duration // a delivery's round trip: the peer loop waits for it, heard is set at its end
	oneway                   time.Duration // from a delivery's send until the peer's Redis runs it (the rig's proxies: 0)
	rate                     float64       // calls per second each instance offers each key (round robin over the region's instances)
	fixed                    bool          // a fixed window, else a token bucket
	limit                    float64       // events per period
	period                   time.Duration
	burst                    float64       // token bucket capacity
	run, pre                 time.Duration // counted run, after pre of the same traffic (not counted)
	cut                      time.Duration // region 0 cut off from the others from the counted run's start
	peerFirst                float64       // chance that a peer loop, at its instance's tick, takes its inbox before the main loop fills it
	spread                   time.Duration // the instances' tickers start uniformly within this (at most sync)
	seed                     uint64
}

// counts is what the exchange costs one region's Redis.
type counts struct {
	gets   int64 // journal GETs (each peer loop of each instance reads its own)
	charge int64 // region script EVALSHAs received that charge (a journal past what was applied)
	noop   int64 // region script EVALSHAs received that change nothing (repeats)
	share  int64 // region script EVALSHAs charging a silent peer's share (this region's instances')
	pings  int64 // PINGs received (a peer loop with nothing to deliver)
}

// outcome is a simulation's result over the counted run, summed over the
// simulated keys.
type outcome struct {
	admitted, limit, offered float64
	perKey                   []float64 // admitted, by key
	region                   []counts  // by region
	peak                     []int64   // by region: the most exchange commands (gets, EVALSHAs) in one interval
	perInterval              [][]int64 // by region, by interval of the counted run
}

// kstate is a rule's state of one key on one region's Redis.
type kstate struct {
	u   float64 // token bucket: tokens used at t; fixed window: events in window win
	t   int64
	win int64
}

// journal is a key's journal on its region's Redis (scripts/region.lua):
// events admitted (cumulative) and the last one's time (µs).
type journal struct{ c, t int64 } // events admitted (cumulative) and the last one's time (µs)

// record is what a region's Redis applied of one peer's journal of a key
// (scripts/region_apply.lua's peer record).
type record struct{ wc, s, ta int64 } // a peer's journal applied, silent time charged, when that charge ended

// instance is one limiter's exchange (regions.go's exchange and its
// regionPeers), its peer loops' state indexed by peer region.
type instance struct {
	r, i           int
	phase          int64
	peerFirst      []bool
	active         map[int32]struct{}
	inbox, pending []map[int32]struct{} // by peer region
	heard, busy    []int64              // by peer region
	owed           []bool               // a tick came while the peer loop waited on a delivery
	inFlight       [][]int32            // by peer: the keys of the delivery in flight
}

// item is one key's journal as a peer loop read it.
type item struct {
	k    int32
	c, t int64
}

// The kinds of event.
const (
	evCall = iota
	evTick
	evDeliver
	evReply
)

// event is a call, an instance's tick, a delivery reaching a peer's Redis,
// or its reply reaching the instance.
type event struct {
	t, seq int64
	kind   int
	r, i   int    // region and instance (a call: region and key; a delivery: origin)
	p      int    // peer region
	j      int64  // a call: its index among the key's calls in the region
	items  []item // a delivery's journals
}

// queue orders events by time, then by when they were scheduled.
type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(a, b int) bool {
	return q[a].t < q[b].t || q[a].t == q[b].t && q[a].seq < q[b].seq
}
func (q queue) Swap(a, b int) { q[a], q[b] = q[b], q[a] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// sim is one run of the model: time in µs, from 0 (every instance already
// started, every peer just heard) to pre + run.
type sim struct {
	cfg            config
	S, rtt, oneway int64
	period         int64
	share, horizon float64
	start, end     int64 // the counted run
	cutFrom, cutTo int64
	now, seq       int64
	q              queue
	state          [][]kstate  // [region][key]
	jour           [][]journal // [region][key]
	rec            [][][]record
	inst           [][]*instance
	gap            float64 // µs between a key's calls in a region
	callStart      [][]float64
	callOff        [][]int
	out            outcome
}

func us(d time.Duration) int64 { return int64(d / time.Microsecond) }

// simulate runs cfg's model and returns its outcome.
func simulate(cfg config) outcome {
	s := &sim{cfg: cfg, S: us(cfg.sync), rtt: us(cfg.rtt), oneway: us(cfg.oneway), period: us(cfg.period)}
	rng := rand.New(rand.NewPCG(cfg.seed, 0x5eed))
	N, M, K := cfg.regions, cfg.instances, cfg.keys
	s.share = float64(1_000_000/N) / 1e6 // the script's share, in ppm
	s.horizon = 2 * float64(s.period)
	if !cfg.fixed && cfg.burst > cfg.limit {
		s.horizon = float64(s.period) * cfg.burst / cfg.limit
	}
	s.start, s.end = us(cfg.pre), us(cfg.pre+cfg.run)
	s.cutFrom, s.cutTo = s.start, s.start+us(cfg.cut)
	s.out.region = make([]counts, N)
	s.out.peak = make([]int64, N)
	s.out.perKey = make([]float64, K)
	s.out.perInterval = make([][]int64, N)
	s.state, s.jour, s.rec = make([][]kstate, N), make([][]journal, N), make([][][]record, N)
	s.inst, s.callStart, s.callOff = make([][]*instance, N), make([][]float64, N), make([][]int, N)
	s.gap = 1e6 / (cfg.rate * float64(M))
	base := rng.Int64N(max(s.S, 1)) // the run's start, as the tickers see it
	for r := range N {
		if s.S > 0 {
			s.out.perInterval[r] = make([]int64, (s.end-s.start+s.S-1)/s.S)
		}
		s.state[r], s.jour[r], s.rec[r] = make([]kstate, K), make([]journal, K), make([][]record, K)
		for k := range K {
			s.rec[r][k] = make([]record, N)
		}
		for i := range M {
			in := &instance{r: r, i: i, phase: 1 + (base+rng.Int64N(max(min(us(cfg.spread), s.S), 1)))%max(s.S, 1), active: map[int32]struct{}{},
				peerFirst: make([]bool, N), inbox: make([]map[int32]struct{}, N), pending: make([]map[int32]struct{}, N),
				heard: make([]int64, N), busy: make([]int64, N), owed: make([]bool, N), inFlight: make([][]int32, N)}
			for p := range N {
				in.peerFirst[p] = rng.Float64() < cfg.peerFirst
				in.inbox[p], in.pending[p] = map[int32]struct{}{}, map[int32]struct{}{}
			}
			s.inst[r] = append(s.inst[r], in)
			if s.S > 0 {
				s.push(&event{t: in.phase, kind: evTick, r: r, i: i})
			}
		}
		s.callStart[r], s.callOff[r] = make([]float64, K), make([]int, K)
		for k := range K {
			s.callStart[r][k], s.callOff[r][k] = rng.Float64()*s.gap, rng.IntN(M)
			s.push(&event{t: int64(s.callStart[r][k]), kind: evCall, r: r, i: k})
		}
	}
	for s.q.Len() > 0 {
		e := heap.Pop(&s.q).(*event)
		if e.t >= s.end {
			break
		}
		s.now = e.t
		switch e.kind {
		case evCall:
			s.call(e)
		case evTick:
			s.tick(s.inst[e.r][e.i])
			e.t += s.S
			s.push(e)
		case evDeliver:
			for _, it := range e.items {
				s.applyJournal(e.p, it.k, e.r, it.c, it.t)
			}
			if len(e.items) == 0 && s.counted() {
				s.out.region[e.p].pings++
			}
		case evReply:
			s.reply(s.inst[e.r][e.i], e.p)
		}
	}
	for r := range N {
		for _, n := range s.out.perInterval[r] {
			s.out.peak[r] = max(s.out.peak[r], n)
		}
	}
	w := float64(s.end-s.start) / float64(s.period)
	if cfg.fixed {
		w = math.Ceil(float64(s.end)/float64(s.period)) - math.Floor(float64(s.start)/float64(s.period))
	} else if cfg.pre == 0 {
		w += cfg.burst / cfg.limit
	}
	s.out.limit = w * cfg.limit * float64(K)
	return s.out
}

func (s *sim) push(e *event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.q, e)
}

func (s *sim) counted() bool { return s.now >= s.start && s.now < s.end }

// cost adds n exchange commands to region r's interval now.
func (s *sim) cost(r int, n int64) {
	if s.S > 0 && s.counted() {
		s.out.perInterval[r][(s.now-s.start)/s.S] += n
	}
}

func (s *sim) linked(a, b int) bool {
	return !(a == 0 || b == 0) || s.now < s.cutFrom || s.now >= s.cutTo
}

// refresh brings st to now: a bucket's refill, a new window.
func (s *sim) refresh(st *kstate) {
	if s.cfg.fixed {
		if w := s.now / s.period; w != st.win {
			st.u, st.win = 0, w
		}
		return
	}
	st.u = max(0, st.u-s.cfg.limit*float64(s.now-st.t)/float64(s.period))
	st.t = s.now
}

// call is the j-th call of key e.i in region e.r: the region's Redis
// decides it, and the instance notes the key.
func (s *sim) call(e *event) {
	r, k, M := e.r, e.i, s.cfg.instances
	in := s.inst[r][(int(e.j)+s.callOff[r][k])%M]
	st := &s.state[r][k]
	s.refresh(st)
	room := s.cfg.limit
	if !s.cfg.fixed {
		room = s.cfg.burst
	}
	if s.counted() {
		s.out.offered++
	}
	if st.u+1 <= room+1e-9 {
		st.u++
		s.jour[r][k].c++
		s.jour[r][k].t = s.now
		if s.counted() {
			s.out.admitted++
			s.out.perKey[k]++
		}
		if s.S == 0 { // no interval: every peer applies the journal at once
			for p := range s.cfg.regions {
				if p != r && s.linked(r, p) {
					s.applyJournal(p, int32(k), r, s.jour[r][k].c, s.now)
				}
			}
		}
	}
	in.active[int32(k)] = struct{}{}
	e.j++
	e.t = int64(s.callStart[r][k] + float64(e.j)*s.gap)
	s.push(e)
}

// tick is an instance's exchange interval: its main loop and its peer
// loops, in the order their tickers fire.
func (s *sim) tick(in *instance) {
	for p := range s.cfg.regions {
		if p != in.r && in.peerFirst[p] {
			s.peerLoop(in, p)
		}
	}
	for p := range s.cfg.regions { // the main loop: the keys to every peer's inbox, then the silent peers' shares
		if p == in.r {
			continue
		}
		for k := range in.active {
			in.inbox[p][k] = struct{}{}
		}
	}
	for p := range s.cfg.regions {
		if p == in.r || s.now-in.heard[p] <= 4*s.S {
			continue
		}
		for k := range in.active {
			s.applyShare(in.r, k, p, in.heard[p])
		}
	}
	clear(in.active)
	for p := range s.cfg.regions {
		if p != in.r && !in.peerFirst[p] {
			s.peerLoop(in, p)
		}
	}
}

// peerLoop is one peer loop's round: the inbox joins the pending keys,
// whose journals are read and sent to the peer's Redis.
func (s *sim) peerLoop(in *instance, p int) {
	if in.busy[p] > s.now {
		in.owed[p] = true
		return
	}
	for k := range in.inbox[p] {
		in.pending[p][k] = struct{}{}
	}
	clear(in.inbox[p])
	if s.counted() {
		s.out.region[in.r].gets += int64(len(in.pending[p]))
	}
	s.cost(in.r, int64(len(in.pending[p])))
	var items []item
	var keys []int32
	for k := range in.pending[p] {
		j := s.jour[in.r][k]
		if j.c == 0 { // nothing admitted: nothing to tell
			delete(in.pending[p], k)
			continue
		}
		items = append(items, item{k, j.c, j.t})
		keys = append(keys, k)
	}
	if !s.linked(in.r, p) {
		return // refused at once: the keys stay pending
	}
	in.busy[p] = s.now + s.rtt
	in.inFlight[p] = keys
	s.push(&event{t: s.now + s.oneway, kind: evDeliver, r: in.r, p: p, items: items})
	s.push(&event{t: s.now + s.rtt, kind: evReply, r: in.r, i: in.i, p: p})
}

// reply ends a delivery: the peer is heard, its keys are no longer
// pending, and a tick that came meanwhile runs.
func (s *sim) reply(in *instance, p int) {
	in.busy[p] = 0
	if s.linked(in.r, p) { // a reply lost to a cut: the keys stay pending (what was sent was applied)
		in.heard[p] = s.now
		for _, k := range in.inFlight[p] {
			delete(in.pending[p], k)
		}
	}
	in.inFlight[p] = nil
	if in.owed[p] {
		in.owed[p] = false
		s.peerLoop(in, p)
	}
}

// applyJournal is region_apply.lua's 'u' on region p's Redis: origin q's
// journal (c, t) of key k, charged past what p applied.
func (s *sim) applyJournal(p int, k int32, q int, c, t int64) {
	rc := &s.rec[p][k][q]
	s.cost(p, 1)
	if rc.s > 0 && float64(rc.ta) < float64(s.now)-s.horizon {
		rc.s = 0
	}
	dc := c - rc.wc
	if dc <= 0 {
		if s.counted() {
			s.out.region[p].noop++
		}
		return
	}
	if s.counted() {
		s.out.region[p].charge++
	}
	d := float64(dc) - math.Floor(s.cfg.limit*s.share*float64(rc.s)/float64(s.period))
	st := &s.state[p][k]
	s.refresh(st)
	if d > 0 && t < s.now { // as_of: a bucket at rest gets the refill since t back; an ended window gets nothing
		switch {
		case s.cfg.fixed && t/s.period < s.now/s.period:
			d = 0
		case !s.cfg.fixed && st.u == 0:
			d -= math.Floor(float64(s.now-t) * s.cfg.limit / float64(s.period))
		}
	}
	st.u = max(0, st.u+d) // a charge past the limit is owed; a refund stops at nothing used
	rc.wc, rc.s = c, 0
}

// applyShare is region_apply.lua's 'a' on region r's Redis: silent peer
// p's share of the limit for key k, from since (or the last such charge).
func (s *sim) applyShare(r int, k int32, p int, since int64) {
	rc := &s.rec[r][k][p]
	s.cost(r, 1)
	if s.counted() {
		s.out.region[r].share++
	}
	if rc.s > 0 && float64(rc.ta) < float64(s.now)-s.horizon {
		rc.s = 0
	}
	from := max(since, rc.ta)
	if from >= s.now {
		return
	}
	per := s.cfg.limit * s.share / float64(s.period)
	d := math.Floor(per*float64(rc.s+s.now-from)) - math.Floor(per*float64(rc.s))
	st := &s.state[r][k]
	s.refresh(st)
	st.u += d
	rc.s, rc.ta = rc.s+s.now-from, s.now
}
