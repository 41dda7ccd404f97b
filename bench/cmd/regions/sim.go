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
	oneway                   time.Duration // from a delivery's send until the peer's Redis runs it
	rate                     float64       // calls per second each instance offers each key (round robin over the region's instances)
	fixed                    bool          // a fixed window, else a token bucket
	limit                    float64       // events per period
	period                   time.Duration
	burst                    float64       // token bucket capacity
	run, pre                 time.Duration // counted run, after pre of the same traffic (not counted)
	cut                      time.Duration // region 0 cut off from the others from the counted run's start
	spread                   time.Duration // the instances' tickers start uniformly within this (at most sync)
	seed                     uint64
	reread                   bool // not the implementation: a peer loop reads its pending keys' journals again once a peer answers after a failed delivery

	// The cost model: each simulated key stands for scale active keys (0:
	// 1), which a call of the region script takes batch at a time (0: 64,
	// maxRegionBatch), from any keys on one server, or from one hash slot
	// of slots (0: 16384) on a cluster; cost prices the commands.
	scale   float64
	cluster bool
	batch   int
	slots   int
	cost    costs
}

// costs are Redis's CPU per exchange command (µs) and a delivery's size
// on the link (bytes): a region script call costs call and then, for each
// of its keys, what the key's work costs.
type costs struct {
	get                 float64 // a journal GET
	call                float64 // a region script call, before its keys
	charge, noop        float64 // a delivered journal's key that charges, that changes nothing
	share, skip         float64 // a silent share's key charged, passed over (the peer delivered the key here within the bound)
	callBytes, keyBytes float64 // a delivery's EVALSHA: bytes a call and a key
}

// counts is what the exchange costs one region's Redis, over the counted
// run, for all the active keys (the simulated ones times scale).
type counts struct {
	gets         float64 // journal GETs (the main loops', one per key decided in an interval)
	calls        float64 // region script calls received (deliveries), expected under the batching
	charge, noop float64 // keys those calls charged, left as they were (repeats)
	shareCalls   float64 // region script calls charging silent peers' shares (this region's instances')
	share, skip  float64 // keys those calls charged, passed over
	pings        float64 // PINGs received (a peer loop with nothing to deliver; not scaled)
	cpu, bytes   float64 // Redis CPU (µs), bytes received on the links
}

// outcome is a simulation's result over the counted run, summed over the
// simulated keys.
type outcome struct {
	admitted, limit, offered float64
	perKey                   []float64 // admitted, by key
	region                   []counts  // by region
	peak, peakKeys, peakCPU  []float64 // by region, in the interval of the most CPU: exchange commands (GETs, calls), keys the calls carried, CPU (µs)
	perInterval, keyInterval [][]float64
	cpuInterval              [][]float64
}

// kstate is a rule's state of one key on one region's Redis.
type kstate struct {
	u   float64 // token bucket: tokens used at t; fixed window: events in window win
	t   int64
	win int64
}

// journal is a key's journal on its region's Redis (scripts/region.lua):
// events admitted (cumulative) and the last one's time (µs).
type journal struct{ c, t int64 }

// record is what a region's Redis applied of one peer's journal of a key
// (scripts/region_apply.lua's peer record): the journal applied, the
// silent time charged and when that charge ended, when a journal was
// last applied.
type record struct{ wc, s, ta, tu int64 }

// item is one key's journal as the main loop read it.
type item struct {
	k    int32
	c, t int64
}

// instance is one limiter's exchange (regions.go's exchange and its
// regionPeers), its peer loops' state indexed by peer region.
type instance struct {
	r, i           int
	phase          int64
	active         map[int32]struct{}
	inbox, pending []map[int32]item // by peer region
	heard, busy    []int64          // by peer region
	wakes          []int            // by peer: the peer loop's wakes so far
	owed           []bool           // a wake came while the peer loop waited on a delivery
	failed         []bool           // by peer: the last delivery failed
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
	r, i   int     // region and instance (a call: region and key; a delivery: origin)
	p      int     // peer region
	j      int64   // a call: its index among the key's calls in the region
	items  []item  // a delivery's journals
	calls  float64 // a delivery's region script calls
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

// staleSyncs is the staleness bound in intervals (regions.go).
const staleSyncs = 4

// sim is one run of the model: time in µs, from 0 (every instance already
// started, every peer just heard) to pre + run.
type sim struct {
	cfg                   config
	S, rtt, oneway, bound int64
	period                int64
	share, life           float64
	start, end            int64 // the counted run
	cutFrom, cutTo        int64
	now, seq              int64
	q                     queue
	state                 [][]kstate  // [region][key]
	jour                  [][]journal // [region][key]
	rec                   [][][]record
	inst                  [][]*instance
	gap                   float64 // µs between a key's calls in a region
	callStart             [][]float64
	callOff               [][]int
	batched               map[int]float64 // calls for n simulated keys
	out                   outcome
}

func us(d time.Duration) int64 { return int64(d / time.Microsecond) }

// simulate runs cfg's model and returns its outcome.
func simulate(cfg config) outcome {
	s := newSim(cfg)
	s.populate(rand.New(rand.NewPCG(s.cfg.seed, 0x5eed)))
	s.loop()
	return s.finish()
}

// newSim returns a run of cfg's model (its unset cost settings at their
// defaults) with its outcome's counters made, before any instance or call.
func newSim(cfg config) *sim {
	if cfg.scale == 0 {
		cfg.scale = 1
	}
	if cfg.batch == 0 {
		cfg.batch = 64
	}
	if cfg.slots == 0 {
		cfg.slots = 16384
	}
	s := &sim{cfg: cfg, S: us(cfg.sync), rtt: us(cfg.rtt), oneway: us(cfg.oneway), period: us(cfg.period), batched: map[int]float64{}}
	s.bound = staleSyncs * s.S
	N, M, K := cfg.regions, cfg.instances, cfg.keys
	s.share = float64(1_000_000/N) / 1e6 // the script's share, in ppm
	horizon := 2 * float64(s.period)     // regions.go's horizon and life
	if !cfg.fixed && cfg.burst > cfg.limit {
		horizon = float64(s.period) * cfg.burst / cfg.limit
	}
	s.life = max(math.Floor(horizon/1e3)*1e3+1e3, 10*float64(s.S))
	s.start, s.end = us(cfg.pre), us(cfg.pre+cfg.run)
	s.cutFrom, s.cutTo = s.start, s.start+us(cfg.cut)
	s.out.region = make([]counts, N)
	s.out.peak, s.out.peakKeys, s.out.peakCPU = make([]float64, N), make([]float64, N), make([]float64, N)
	s.out.perKey = make([]float64, K)
	s.out.perInterval, s.out.keyInterval, s.out.cpuInterval = make([][]float64, N), make([][]float64, N), make([][]float64, N)
	s.state, s.jour, s.rec = make([][]kstate, N), make([][]journal, N), make([][][]record, N)
	s.inst, s.callStart, s.callOff = make([][]*instance, N), make([][]float64, N), make([][]int, N)
	s.gap = 1e6 / (cfg.rate * float64(M))
	return s
}

// populate makes each region's state, its instances (their tickers'
// phases drawn from rng) and its keys' first calls (their offsets drawn
// from rng), and schedules the ticks and the calls.
func (s *sim) populate(rng *rand.Rand) {
	N, M, K := s.cfg.regions, s.cfg.instances, s.cfg.keys
	base := rng.Int64N(max(s.S, 1)) // the run's start, as the tickers see it
	for r := range N {
		if s.S > 0 {
			n := (s.end - s.start + s.S - 1) / s.S
			s.out.perInterval[r], s.out.keyInterval[r], s.out.cpuInterval[r] = make([]float64, n), make([]float64, n), make([]float64, n)
		}
		s.state[r], s.jour[r], s.rec[r] = make([]kstate, K), make([]journal, K), make([][]record, K)
		for k := range K {
			s.rec[r][k] = make([]record, N)
		}
		for i := range M {
			in := s.newInstance(r, i, 1+(base+rng.Int64N(max(min(us(s.cfg.spread), s.S), 1)))%max(s.S, 1))
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
}

// newInstance returns instance i of region r, its ticker at phase.
func (s *sim) newInstance(r, i int, phase int64) *instance {
	N := s.cfg.regions
	in := &instance{r: r, i: i, phase: phase, active: map[int32]struct{}{},
		inbox: make([]map[int32]item, N), pending: make([]map[int32]item, N),
		heard: make([]int64, N), busy: make([]int64, N), wakes: make([]int, N), owed: make([]bool, N), failed: make([]bool, N)}
	for p := range N {
		in.inbox[p], in.pending[p] = map[int32]item{}, map[int32]item{}
	}
	return in
}

// loop runs the events in order until the queue is empty or the run ends.
func (s *sim) loop() {
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
			s.delivered(e)
		case evReply:
			s.reply(s.inst[e.r][e.i], e.p)
		}
	}
}

// finish returns the outcome: each region's busiest interval (by Redis
// CPU) picked out, and the limit over the counted run.
func (s *sim) finish() outcome {
	cfg := s.cfg
	for r := range cfg.regions {
		for i, cpu := range s.out.cpuInterval[r] {
			if cpu > s.out.peakCPU[r] {
				s.out.peak[r], s.out.peakKeys[r], s.out.peakCPU[r] = s.out.perInterval[r][i], s.out.keyInterval[r][i], cpu
			}
		}
	}
	w := float64(s.end-s.start) / float64(s.period)
	if cfg.fixed {
		w = math.Ceil(float64(s.end)/float64(s.period)) - math.Floor(float64(s.start)/float64(s.period))
	} else if cfg.pre == 0 {
		w += cfg.burst / cfg.limit
	}
	s.out.limit = w * cfg.limit * float64(cfg.keys)
	return s.out
}

func (s *sim) push(e *event) {
	s.seq++
	e.seq = s.seq
	heap.Push(&s.q, e)
}

// counting reports whether the exchange's costs now are counted.
func (s *sim) counting() bool { return s.S > 0 && s.counted() }

func (s *sim) counted() bool { return s.now >= s.start && s.now < s.end }

// cost adds n exchange commands, keys of region script calls and cpu µs
// of Redis CPU to region r's interval now.
func (s *sim) cost(r int, n, keys, cpu float64) {
	i := (s.now - s.start) / s.S
	s.out.perInterval[r][i] += n
	s.out.keyInterval[r][i] += keys
	s.out.cpuInterval[r][i] += cpu
	s.out.region[r].cpu += cpu
}

// calls returns the region script calls that carry n simulated keys of
// one rule set (n·scale keys): a batch each on one server, and on a
// cluster, for each hash slot holding some, a batch of them each (the
// keys spread over the slots at random).
func (s *sim) calls(n int) float64 {
	if n == 0 {
		return 0
	}
	if v, ok := s.batched[n]; ok {
		return v
	}
	v := batchCalls(float64(n)*s.cfg.scale, s.cfg.batch, s.cfg.slots, s.cfg.cluster)
	s.batched[n] = v
	return v
}

// batchCalls returns the region script calls that carry keys keys of one
// rule set, at most batch a call: on one server, any keys together; on a
// cluster of slots hash slots, only keys of one slot (the keys spread over
// the slots at random: slots·E[ceil(X/batch)], X ~ Poisson(keys/slots)).
func batchCalls(keys float64, batch, slots int, cluster bool) float64 {
	b := float64(batch)
	if !cluster {
		return math.Ceil(keys / b)
	}
	lambda, sum := keys/float64(slots), 0.0
	if lambda == 0 {
		return 0
	}
	lo, hi := max(1, int(lambda-12*math.Sqrt(lambda)-20)), int(lambda+12*math.Sqrt(lambda)+20)
	for x := lo; x <= hi; x++ {
		lg, _ := math.Lgamma(float64(x) + 1)
		sum += math.Exp(-lambda+float64(x)*math.Log(lambda)-lg) * math.Ceil(float64(x)/b)
	}
	return float64(slots) * sum
}

// linked reports whether regions a and b reach each other now: region 0
// is cut off from the others from cutFrom until cutTo.
func (s *sim) linked(a, b int) bool {
	return a != 0 && b != 0 || s.now < s.cutFrom || s.now >= s.cutTo
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

// tick is an instance's main loop's round: it reads the journals of the
// keys decided since (one GET each), hands them to every peer loop and
// wakes it, then charges each peer silent past the bound its share of
// those keys, on this region's Redis.
func (s *sim) tick(in *instance) {
	n, k := float64(len(in.active))*s.cfg.scale, s.cfg.cost
	if s.counting() {
		s.out.region[in.r].gets += n
		s.cost(in.r, n, 0, n*k.get)
	}
	var items []item
	for key := range in.active {
		// A journal lives a life after its last admission.
		if j := s.jour[in.r][key]; j.c > 0 && float64(s.now-j.t) < s.life {
			items = append(items, item{key, j.c, j.t})
		}
	}
	for p := range s.cfg.regions {
		if p == in.r {
			continue
		}
		for _, it := range items {
			in.inbox[p][it.k] = it
		}
		if in.busy[p] > s.now {
			in.owed[p] = true // its loop takes the inbox when the delivery ends
		} else {
			s.peerLoop(in, p)
		}
	}
	for p := range s.cfg.regions {
		if p == in.r || s.now-in.heard[p] <= s.bound || len(in.active) == 0 {
			continue
		}
		if s.counting() {
			c := s.calls(len(in.active))
			s.out.region[in.r].shareCalls += c
			s.cost(in.r, c, 0, c*k.call)
		}
		for key := range in.active {
			s.applyShare(in.r, key, p, in.heard[p])
		}
	}
	clear(in.active)
}

// peerLoop is one peer loop's round, woken by its main loop: the inbox
// joins the keys pending, which are sent to the peer's Redis, a batch of
// keys per call (a PING if none). A silent peer is tried every other
// wake.
func (s *sim) peerLoop(in *instance, p int) {
	in.wakes[p]++
	if in.wakes[p]%2 == 0 && s.now-in.heard[p] > s.bound {
		return
	}
	for key, it := range in.inbox[p] {
		in.pending[p][key] = it
	}
	clear(in.inbox[p])
	if !s.linked(in.r, p) {
		in.failed[p] = true
		return // refused at once: the keys stay pending
	}
	if s.cfg.reread && in.failed[p] { // (-reread) the peer answers: its pending journals read again
		in.failed[p] = false
		n := float64(len(in.pending[p])) * s.cfg.scale
		if s.counting() {
			s.out.region[in.r].gets += n
			s.cost(in.r, n, 0, n*s.cfg.cost.get)
		}
		for key := range in.pending[p] {
			if j := s.jour[in.r][key]; j.c > 0 {
				in.pending[p][key] = item{key, j.c, j.t}
			}
		}
	}
	items := make([]item, 0, len(in.pending[p]))
	for _, it := range in.pending[p] {
		items = append(items, it)
	}
	in.busy[p] = s.now + s.rtt
	s.push(&event{t: s.now + s.oneway, kind: evDeliver, r: in.r, p: p, items: items, calls: s.calls(len(items))})
	s.push(&event{t: s.now + s.rtt, kind: evReply, r: in.r, i: in.i, p: p})
}

// delivered runs a delivery on the peer's Redis: its calls, each key's
// journal applied.
func (s *sim) delivered(e *event) {
	if s.counting() {
		c, k := &s.out.region[e.p], s.cfg.cost
		if len(e.items) == 0 {
			c.pings++
		}
		n := float64(len(e.items)) * s.cfg.scale
		c.calls += e.calls
		c.bytes += e.calls*k.callBytes + n*k.keyBytes
		s.cost(e.p, e.calls, 0, e.calls*k.call)
	}
	for _, it := range e.items {
		s.applyJournal(e.p, it.k, e.r, it.c, it.t)
	}
}

// reply ends a delivery: the peer is heard, nothing is pending any more,
// and a wake that came meanwhile runs the loop again.
func (s *sim) reply(in *instance, p int) {
	in.busy[p] = 0
	if s.linked(in.r, p) { // a reply lost to a cut: the keys stay pending (what was sent was applied)
		in.heard[p] = s.now
		clear(in.pending[p])
	} else {
		in.failed[p] = true
	}
	if in.owed[p] {
		in.owed[p] = false
		s.peerLoop(in, p)
	}
}

// applyJournal is region_apply.lua's 'u' for one key on region p's Redis:
// origin q's journal (c, t) of key k, charged past what p applied.
func (s *sim) applyJournal(p int, k int32, q int, c, t int64) {
	rc := &s.rec[p][k][q]
	if rc.s > 0 && float64(rc.ta) < float64(s.now)-s.life {
		rc.s = 0
	}
	dc := c - rc.wc
	if dc <= 0 {
		if s.counting() {
			s.out.region[p].noop += s.cfg.scale
			s.cost(p, 0, s.cfg.scale, s.cfg.scale*s.cfg.cost.noop)
		}
		return
	}
	if s.counting() {
		s.out.region[p].charge += s.cfg.scale
		s.cost(p, 0, s.cfg.scale, s.cfg.scale*s.cfg.cost.charge)
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
	rc.wc, rc.s, rc.tu = c, 0, s.now
}

// applyShare is region_apply.lua's 'a' for one key on region r's Redis:
// silent peer p's share of the limit for key k, from since (or the last
// such charge), unless p delivered a journal of k here within the bound.
func (s *sim) applyShare(r int, k int32, p int, since int64) {
	rc := &s.rec[r][k][p]
	if rc.s > 0 && float64(rc.ta) < float64(s.now)-s.life {
		rc.s = 0
	}
	from := max(since, rc.ta)
	if rc.tu > 0 && s.now-rc.tu <= s.bound || from >= s.now { // heard here, or charged already
		if s.counting() {
			s.out.region[r].skip += s.cfg.scale
			s.cost(r, 0, s.cfg.scale, s.cfg.scale*s.cfg.cost.skip)
		}
		return
	}
	if s.counting() {
		s.out.region[r].share += s.cfg.scale
		s.cost(r, 0, s.cfg.scale, s.cfg.scale*s.cfg.cost.share)
	}
	per := s.cfg.limit * s.share / float64(s.period)
	d := math.Floor(per*float64(rc.s+s.now-from)) - math.Floor(per*float64(rc.s))
	st := &s.state[r][k]
	s.refresh(st)
	st.u += d
	rc.s, rc.ta = rc.s+s.now-from, s.now
}
