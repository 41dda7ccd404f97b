package redlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redlimit/redlimit/internal/hotkey"
	"github.com/redlimit/redlimit/internal/lru"
	"github.com/redlimit/redlimit/internal/outage"
)

// prefetchConfig is WithPrefetch's arguments.
type prefetchConfig struct {
	size   int
	maxAge time.Duration
}

const (
	// prefetchMaxHeld bounds the prefetches a limiter holds at once.
	prefetchMaxHeld = 1024
	// prefetchKeys bounds the keys whose rate a limiter tracks.
	prefetchKeys = 16 * 1024
	// prefetchMaxAge is the longest maxAge.
	prefetchMaxAge = time.Minute
	// prefetchReturnTimeout bounds taking a prefetch (or the call's deadline, if
	// later; Close ends it).
	prefetchReturnTimeout = time.Second
	// prefetchSettleTimeout bounds each give-back of the sweeper (one script
	// call; what fails is tried again at the next sweep) and all of
	// Close's together, so that Close ends within about this while Redis
	// hangs.
	prefetchSettleTimeout = 100 * time.Millisecond
	// prefetchCloseWorkers is how many prefetches Close gives back at once.
	prefetchCloseWorkers = 16
	// prefetchIDPrefix starts a prefetch's reservation id; reply.lua sets no
	// penalty block when it denies a prefetch (it is not a call's denial).
	prefetchIDPrefix = "prefetch:"
)

// check validates the prefetch options against the engine's rules.
func (c prefetchConfig) check(kind string, rules []rule, reserveTTL time.Duration) error {
	bad := func(format string, args ...any) error {
		return errorf("%s: WithPrefetch: %s: %w", kind, fmt.Sprintf(format, args...), ErrInvalidArgument)
	}
	switch {
	case c.size == 0:
		return nil
	case c.size < hotkey.MinEvents || c.size > MaxRate:
		return bad("size %d must be 0 or between %d and %d", c.size, hotkey.MinEvents, MaxRate)
	case c.maxAge < time.Millisecond || c.maxAge > prefetchMaxAge:
		return bad("maxAge %v must be between 1ms and %v", c.maxAge, prefetchMaxAge)
	case c.maxAge > reserveTTL/2:
		return bad("maxAge %v must be at most half the reservation lifetime %v", c.maxAge, reserveTTL)
	}
	if !prefetchable(&ruleSet{rules: rules}) {
		return bad("prefetches are for token buckets and fixed windows (and policies of token buckets, none per call): " +
			"a sliding log's, a sliding counter's and a sub-window counter's events carry their time, a leaky bucket's have their own delay, and a warm-up's cost depends on when they are taken")
	}
	return nil
}

// prefetchable reports whether calls under rs can be served from a prefetch: one
// token bucket or fixed window, or token buckets only, none per call (a
// per-call rule counts a call as one event whatever n, so a prefetch of k
// events would take one in Redis and serve k calls) and none with a
// warm-up (what a block of events costs depends on when they are taken).
func prefetchable(rs *ruleSet) bool {
	for i := range rs.rules {
		if rs.rules[i].perCall || rs.rules[i].alg.warm {
			return false
		}
	}
	if len(rs.rules) == 1 {
		s := rs.rules[0].alg.strategy
		return s == TokenBucket || s == FixedWindow
	}
	for i := range rs.rules {
		if rs.rules[i].alg.strategy != TokenBucket {
			return false
		}
	}
	return true
}

// PrefetchStats is what a limiter's prefetches hold and did (see [WithPrefetch]).
type PrefetchStats struct {
	Held   int   // prefetches held now, or being taken
	Unused int64 // events those prefetches took in Redis and have not served: capacity idle in this process
	// Taken counts the prefetches taken, Served the calls served from a prefetch
	// without a round trip, Returned the unused events settled back to
	// Redis (a fixed window takes them back only within their window),
	// and Lost those that could not be (Redis unreachable for half the
	// reservation lifetime, or within Close's 100 ms): they stand as used,
	// until the bucket refills or the window ends.
	Taken, Served, Returned, Lost uint64
}

// PrefetchStats returns what the limiter's prefetches hold now and did so far.
// Without [WithPrefetch] it is all zeros.
func (e *engine) PrefetchStats() PrefetchStats {
	l := e.prefetcher
	if l == nil {
		return PrefetchStats{}
	}
	return PrefetchStats{
		Held:     int(l.nheld.Load()),
		Unused:   l.unused.Load(),
		Taken:    l.taken.Load(),
		Served:   l.served.Load(),
		Returned: l.returned.Load(),
		Lost:     l.lost.Load(),
	}
}

// prefetcher is a limiter's prefetching: per key, a rate estimate and at most one
// prefetch; and the goroutine that gives back what ends.
type prefetcher struct {
	e      *engine
	size   int
	maxAge int64 // ns
	keys   *lru.Cache[*prefetchEntry]
	closed atomic.Bool

	nheld, unused                 atomic.Int64
	taken, served, returned, lost atomic.Uint64

	mu   sync.Mutex
	held map[*prefetch]struct{} // taken and not given back yet
	back []*prefetch            // ended, to give back
	// running: the sweeper runs. It runs only while a prefetch is held: it
	// stops when held is empty, and track starts it again.
	running bool
	wake    chan struct{}
	wg      sync.WaitGroup // the sweeper
	fetches sync.WaitGroup // prefetches being taken (fetch)
	// closing ends at Close: the sweeper stops, the prefetches still being
	// taken end.
	closing    context.Context
	endFetches context.CancelFunc
	// closeCtx bounds the give-backs from Close on (set by Close).
	closeCtx context.Context
	// What could not be given back from Close on: events, prefetches, the
	// first error (guarded by mu).
	closeLost, closeLostPrefetches atomic.Int64
	closeErr                       error
}

// prefetchEntry is one key's prefetch state in this process. Its fields are
// guarded by mu.
type prefetchEntry struct {
	mu       sync.Mutex
	hot      hotkey.State // the key's rate here, and what Redis said it has left (monoNow)
	prefetch *prefetch
	fetching *prefetchRequest // the prefetch request in flight, if any
	epoch    uint64           // Resets: a prefetch taken across one is given back
}

// prefetchRequest is a prefetch request in flight: done is closed when it is
// over, and ok (written before) says whether it left a prefetch on the key.
type prefetchRequest struct {
	done chan struct{}
	ok   bool // a prefetch is on the key: serve from it
	// The answer of the call that asked for the prefetch, when decided
	// (served from it), or its error; else the call is decided on its own.
	res     Result
	why     reason
	decided bool
	err     error
}

// prefetch is k events taken in Redis for one key, served here.
type prefetch struct {
	rv      *Reservation
	entry   *prefetchEntry
	sig     uint64 // the limits it was taken under
	k, used int    // used is guarded by entry.mu while the prefetch is the entry's
	start   int64  // monoNow before the request
	expires int64
	res     Result // Redis's answer to the prefetch request

	settling bool // guarded by prefetcher.mu: being given back, or given back
}

func newPrefetcher(e *engine) *prefetcher {
	closing, endFetches := context.WithCancel(context.Background())
	return &prefetcher{
		e:          e,
		size:       e.cfg.prefetch.size,
		maxAge:     int64(e.cfg.prefetch.maxAge),
		keys:       lru.New[*prefetchEntry](prefetchKeys),
		held:       make(map[*prefetch]struct{}),
		wake:       make(chan struct{}, 1),
		closing:    closing,
		endFetches: endFetches,
	}
}

func newPrefetchEntry() *prefetchEntry { return &prefetchEntry{hot: hotkey.New()} }

// valid reports whether pf can serve n events now under the limits sig.
func (pf *prefetch) valid(now int64, n int, sig uint64) bool {
	return pf.sig == sig && now < pf.expires && pf.k-pf.used >= n
}

// result is the answer to a call served from pf.
func (pf *prefetch) result(now int64) Result {
	return Result{
		Allowed:        true,
		Limit:          pf.res.Limit,
		Rule:           pf.res.Rule,
		Remaining:      pf.k - pf.used,
		ResetAfter:     max(pf.res.ResetAfter-time.Duration(now-pf.start), 0),
		RuleResetAfter: max(pf.res.RuleResetAfter-time.Duration(now-pf.start), 0),
	}
}

// serve answers n events for the key whose first state key is state from
// its prefetch, if it has one that can; it counts the events in the key's
// rate either way. A prefetch that cannot serve is given back.
func (l *prefetcher) serve(state string, n int, rs *ruleSet) (Result, bool) {
	en := l.keys.GetOrAdd(state, newPrefetchEntry)
	now := monoNow()
	en.mu.Lock()
	en.hot.Record(now, n, l.maxAge)
	pf := en.prefetch
	if pf == nil {
		en.mu.Unlock()
		return Result{}, false
	}
	return l.serveUnlock(en, pf, now, n, rs.sig)
}

// serveUnlock answers n events from pf, the prefetch of en, if it can, and
// else gives it back; en.mu is locked, and unlocked on return.
func (l *prefetcher) serveUnlock(en *prefetchEntry, pf *prefetch, now int64, n int, sig uint64) (Result, bool) {
	if !pf.valid(now, n, sig) {
		en.detachLocked()
		en.mu.Unlock()
		l.giveBack(pf)
		return Result{}, false
	}
	pf.used += n
	res := pf.result(now)
	en.mu.Unlock()
	l.unused.Add(-int64(n))
	l.served.Add(1)
	return res, true
}

// stage serves a call from the key's prefetch when it can. Prefetched
// events serve only calls that may use all of the limit: a call with a
// share asks Redis, which counts the prefetched events as used, so that
// they never serve it past its share; a reservation asks Redis too.
func (l *prefetcher) stage(r *request, next decider) error {
	r.prefetching = r.rc == nil && r.n > 0 && r.share == 0
	if r.prefetching {
		if res, ok := l.serve(r.state, r.n, r.rs); ok {
			r.res, r.why = res, reasonAllowed
			return nil
		}
	}
	return next(r)
}

// ask asks Redis for r, which prefetches may serve (engine.ask).
func (l *prefetcher) ask(r *request) error {
	var err error
	r.res, r.why, err = l.eval(r.ctx, r.key, r.state, r.n, r.rs)
	return err
}

// eval decides n events for key in Redis: by taking a prefetch when the key
// is hot, else by one call. It is what a call that prefetches may serve
// asks, instead of its runner, when it was not served from a prefetch.
func (l *prefetcher) eval(ctx context.Context, key, state string, n int, rs *ruleSet) (Result, reason, error) {
	en := l.keys.GetOrAdd(state, newPrefetchEntry)
	for {
		en.mu.Lock()
		now := monoNow()
		if pf := en.prefetch; pf != nil {
			// Taken by another call since serve looked.
			if res, ok := l.serveUnlock(en, pf, now, n, rs.sig); ok {
				return res, reasonAllowed, nil
			}
			continue
		}
		if f := en.fetching; f != nil {
			en.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return Result{}, 0, ctx.Err()
			}
			if f.ok {
				continue // serve from it, or wait for the next
			}
			// The request brought no prefetch (denied, or Redis failing):
			// the call is decided on its own, so that calls never queue
			// behind prefetch requests one after another.
			return l.direct(ctx, en, state, n, rs)
		}
		k := l.sizeFor(en, now, n, rs)
		if k == 0 {
			en.mu.Unlock()
			return l.direct(ctx, en, state, n, rs)
		}
		f := &prefetchRequest{done: make(chan struct{})}
		en.fetching = f
		epoch := en.epoch
		en.mu.Unlock()

		if !l.startFetch(ctx, en, f, key, state, k, n, rs, now, epoch) {
			return l.direct(ctx, en, state, n, rs)
		}
		return l.await(ctx, en, f, state, n, rs)
	}
}

// await returns the decision of the prefetch request f that the call of n
// events started: the call's own events from it, or, when fewer than the
// prefetch's were left, the call decided on its own.
func (l *prefetcher) await(ctx context.Context, en *prefetchEntry, f *prefetchRequest, state string, n int, rs *ruleSet) (Result, reason, error) {
	select {
	case <-f.done:
	case <-ctx.Done():
		return Result{}, 0, ctx.Err()
	}
	switch {
	case f.err != nil:
		return Result{}, 0, f.err
	case f.decided:
		return f.res, f.why, nil
	}
	return l.direct(ctx, en, state, n, rs)
}

// startFetch takes a prefetch of k events for the key of en apart from the
// call (see fetch), so that a call whose context ends while Redis takes k
// events for it does not lose them: the prefetch comes to the key all the
// same, and the call returns its context's error. Once the limiter is
// closed it starts nothing, clears en's request f and reports false.
func (l *prefetcher) startFetch(ctx context.Context, en *prefetchEntry, f *prefetchRequest, key, state string, k, n int, rs *ruleSet, now int64, epoch uint64) bool {
	l.mu.Lock()
	if l.closed.Load() { // Close waits for the fetches it can see
		l.mu.Unlock()
		en.mu.Lock()
		en.fetching = nil
		en.mu.Unlock()
		close(f.done)
		l.nheld.Add(-1)
		return false
	}
	l.fetches.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.fetches.Done()
		l.fetch(ctx, en, f, key, state, k, n, rs, now, epoch)
	}()
	return true
}

// fetch takes a prefetch of k events for the key of en, n of them for the
// call that asked for it, and puts it on the key (or gives it back, if a
// Reset or Close came since epoch), then answers f. It runs apart from the
// call, with the call's context values but not its end, bounded by
// prefetchReturnTimeout or the call's deadline, whichever is later.
func (l *prefetcher) fetch(callCtx context.Context, en *prefetchEntry, f *prefetchRequest, key, state string, k, n int, rs *ruleSet, now int64, epoch uint64) {
	budget := prefetchReturnTimeout
	if deadline, ok := callCtx.Deadline(); ok {
		budget = max(budget, time.Until(deadline))
	}
	ctx, cancel := detach(callCtx, l.closing, budget) // Close ends it
	defer cancel()
	res, _, pf, err := l.take(ctx, key, state, k, rs, now)

	en.mu.Lock()
	en.fetching = nil
	if err != nil {
		en.mu.Unlock()
		f.err = err
		l.nheld.Add(-1)
		close(f.done)
		return
	}
	en.hot.Remaining = res.Remaining
	l.sawWindow(en, rs, now, res)
	if pf == nil {
		// Denied: the call is decided on its own, with its own n (a
		// block's denial too: its RetryAfter is for the prefetch's n).
		en.mu.Unlock()
		l.nheld.Add(-1)
		close(f.done)
		return
	}
	pf.entry, pf.used = en, n
	l.taken.Add(1)
	l.unused.Add(int64(k - n))
	f.res, f.why, f.decided = pf.result(now), reasonAllowed, true
	// A Reset or Close that came while the prefetch was taken: the call
	// is admitted, the rest goes back.
	if l.track(pf, en.epoch == epoch) {
		en.prefetch = pf
		f.ok = true
		en.mu.Unlock()
	} else {
		en.hot.Pending += k - n
		en.mu.Unlock()
		l.giveBack(pf)
	}
	close(f.done) // after f's fields
}

// sizeFor returns the size of the prefetch to take for n events, or 0 for one
// call. It holds a place among the held prefetches for a prefetch it sizes (the
// caller lets it go when no prefetch is made). en.mu is held.
func (l *prefetcher) sizeFor(en *prefetchEntry, now int64, n int, rs *ruleSet) int {
	if l.closed.Load() || !prefetchable(rs) {
		return 0
	}
	fixed := rs.rules[0].alg.strategy == FixedWindow
	k := en.hot.Size(now, n, hotkey.Sizing{Max: l.size, MaxAge: l.maxAge, FixedWindow: fixed})
	if k == 0 {
		return 0
	}
	if l.nheld.Add(1) > prefetchMaxHeld {
		l.nheld.Add(-1)
		return 0
	}
	return k
}

// sawWindow records when a fixed window that Redis reported on ends.
// en.mu is held.
func (l *prefetcher) sawWindow(en *prefetchEntry, rs *ruleSet, start int64, res Result) {
	if rs.rules[0].alg.strategy == FixedWindow && len(rs.rules) == 1 && res.ResetAfter > 0 {
		// ResetAfter runs to the window's end from Redis's now, which is
		// after start: start + ResetAfter is never past the end.
		en.hot.WindowEnd = start + int64(res.ResetAfter)
	}
}

// direct decides n events with one script call, as without prefetches, and
// keeps what Redis reports left.
func (l *prefetcher) direct(ctx context.Context, en *prefetchEntry, state string, n int, rs *ruleSet) (Result, reason, error) {
	start := monoNow()
	res, why, err := l.e.evalState(ctx, state, n, rs, nil)
	if err == nil {
		en.mu.Lock()
		en.hot.Remaining = res.Remaining
		l.sawWindow(en, rs, start, res)
		en.mu.Unlock()
		if why == reasonLimit && l.e.cfg.block > 0 {
			// A denial of a call of its own sets the block (a denied
			// prefetch does not): the fallback keeps it (engine.decide
			// keeps the blocked calls').
			l.e.rescue.block(state, rs, min(res.RetryAfter, l.e.cfg.block))
		}
	}
	return res, why, err
}

// take asks Redis for a prefetch of k events, a reservation whose id marks it
// as a prefetch. A denied prefetch (pf nil) holds nothing.
func (l *prefetcher) take(ctx context.Context, key, state string, k int, rs *ruleSet, start int64) (Result, reason, *prefetch, error) {
	rc := &reserveCall{id: prefetchIDPrefix + strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64(), 36)}
	res, why, err := l.e.evalState(ctx, state, k, rs, rc)
	if err != nil || !res.Allowed {
		return res, why, nil, err
	}
	pf := &prefetch{
		rv: &Reservation{
			e: l.e, rs: rs, key: key, state: state,
			id: rc.id, n: k, res: res, tags: rc.tags,
		},
		sig:     rs.sig,
		k:       k,
		start:   start,
		expires: start + l.maxAge,
		res:     res,
	}
	if rs.rules[0].alg.strategy == FixedWindow && len(rs.rules) == 1 && res.ResetAfter > 0 {
		// Events counted in this window must be served in it.
		pf.expires = min(pf.expires, start+int64(res.ResetAfter))
	}
	return res, why, pf, nil
}

// track records a prefetch taken, and starts the sweeper that gives back
// those that end, if it is not running (it stops when none is held). It reports whether the prefetch may be served from: ok, and
// the limiter not closed. The key's entry is locked, so that Close, which
// gives back every prefetch tracked, finds this one on its key or given back.
func (l *prefetcher) track(pf *prefetch, ok bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held[pf] = struct{}{}
	if l.closed.Load() {
		return false
	}
	if !l.running {
		l.running = true
		l.wg.Add(1)
		go l.sweep()
	}
	return ok
}

// giveBack queues a prefetch no longer served from (taken off its entry) to
// be settled: by the sweeper, or here, within Close's time, once the
// limiter is closing.
func (l *prefetcher) giveBack(pf *prefetch) {
	l.mu.Lock()
	if l.closed.Load() {
		ctx := l.closeCtx
		l.mu.Unlock()
		l.settle(ctx, pf, true)
		return
	}
	l.back = append(l.back, pf)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// sweep is the goroutine that gives back prefetches: those queued, and every
// maxAge/4 those that expired. It returns at Close, and when no prefetch is
// held (track starts another with the next prefetch), so that an idle
// limiter costs no goroutine and no CPU.
func (l *prefetcher) sweep() {
	defer l.wg.Done()
	tick := time.NewTicker(time.Duration(max(l.maxAge/4, int64(time.Millisecond))))
	defer tick.Stop()
	for {
		select {
		case <-l.closing.Done():
			return
		case <-tick.C:
			l.expire(monoNow())
		case <-l.wake:
		}
		l.giveBackQueued()
		l.mu.Lock()
		if len(l.held) == 0 && len(l.back) == 0 {
			l.running = false // under mu, as track's check
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

// giveBackQueued settles the prefetches queued, one script call each, each
// within prefetchSettleTimeout; those that fail for an outage are queued
// again. It stops at Close, which gives back the rest.
func (l *prefetcher) giveBackQueued() {
	l.mu.Lock()
	back := l.back
	l.back = nil
	l.mu.Unlock()
	var retry []*prefetch
	for i, pf := range back {
		if l.closing.Err() != nil {
			retry = append(retry, back[i:]...)
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), prefetchSettleTimeout)
		if !l.settle(ctx, pf, false) {
			retry = append(retry, pf)
		}
		cancel()
	}
	if len(retry) > 0 {
		l.mu.Lock()
		l.back = append(l.back, retry...)
		l.mu.Unlock()
	}
}

// expire takes the prefetches that ended by now off their keys and queues them.
func (l *prefetcher) expire(now int64) {
	var ended []*prefetch
	l.mu.Lock()
	for pf := range l.held {
		if pf.expires <= now {
			ended = append(ended, pf)
		}
	}
	l.mu.Unlock()
	for _, pf := range ended {
		if l.detach(pf) {
			l.mu.Lock()
			l.back = append(l.back, pf)
			l.mu.Unlock()
		}
	}
}

// detach takes pf off its key, if it is still the key's prefetch.
func (l *prefetcher) detach(pf *prefetch) bool {
	en := pf.entry
	en.mu.Lock()
	defer en.mu.Unlock()
	if en.prefetch != pf {
		return false
	}
	en.detachLocked()
	return true
}

// detachLocked takes the entry's prefetch off it; its unused events count as
// pending until it is given back. en.mu is held.
func (en *prefetchEntry) detachLocked() {
	en.hot.Pending += en.prefetch.k - en.prefetch.used
	en.prefetch = nil
}

// settle gives back what pf did not serve. It reports false when it should
// be tried again (Redis unreachable, within the reservation lifetime, and
// not final).
func (l *prefetcher) settle(ctx context.Context, pf *prefetch, final bool) bool {
	l.mu.Lock()
	if pf.settling {
		l.mu.Unlock()
		return true // Close and a late give-back: settled once
	}
	pf.settling = true
	l.mu.Unlock()
	unused := int64(pf.k - pf.used)
	var err error
	var res Result
	if l.e.rescue.isDown(pf.rv.state) {
		err = ErrUnavailable
	} else {
		res, err = pf.rv.settleRedis(ctx, pf.used, nil)
	}
	l.mu.Lock()
	if err != nil && !final && (errors.Is(err, ErrUnavailable) || outage.Is(err)) &&
		time.Duration(monoNow()-pf.start) < l.e.cfg.reserveTTL/2 {
		pf.settling = false
		l.mu.Unlock()
		return false
	}
	delete(l.held, pf)
	l.mu.Unlock()
	en := pf.entry
	en.mu.Lock()
	en.hot.Pending -= int(unused)
	if err == nil {
		en.hot.Remaining = res.Remaining
	}
	en.mu.Unlock()
	l.nheld.Add(-1)
	l.unused.Add(-unused)
	if err != nil && !errors.Is(err, ErrSettled) { // settled: an earlier try gave it back, its reply lost
		l.lost.Add(uint64(unused))
		if l.closed.Load() {
			l.closeLost.Add(unused)
			l.closeLostPrefetches.Add(1)
			l.mu.Lock()
			if l.closeErr == nil {
				l.closeErr = err
			}
			l.mu.Unlock()
		}
	} else {
		l.returned.Add(uint64(unused))
	}
	return true
}

// drop gives back this process's prefetch on the key whose first state key is
// state, before a Reset; a prefetch being taken now is given back when it
// comes.
func (l *prefetcher) drop(ctx context.Context, state string) {
	en := l.keys.GetOrAdd(state, newPrefetchEntry)
	en.mu.Lock()
	en.epoch++
	pf := en.prefetch
	if pf != nil {
		en.detachLocked()
	}
	en.mu.Unlock()
	if pf != nil {
		l.settle(ctx, pf, true)
	}
	en.mu.Lock()
	en.hot.Forget() // the Reset empties the key: learn again
	en.mu.Unlock()
}

// close stops the sweeper and gives back every prefetch, all within
// prefetchSettleTimeout. It returns an error wrapping ErrUnavailable (when
// Redis could not be reached) that says how many events of how many prefetches
// it could not give back: they count as used until their state expires.
func (l *prefetcher) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), prefetchSettleTimeout)
	defer cancel()
	l.mu.Lock()
	l.closed.Store(true)
	l.closeCtx = ctx
	l.mu.Unlock()
	// The sweeper stops at its next give-back; a prefetch being taken ends
	// (given back if it landed: track finds the limiter closed); no fetch
	// starts from now on.
	l.endFetches()
	l.giveBackAll(ctx)
	l.wg.Wait()
	l.fetches.Wait()
	// What the sweeper queued again, or a fetch left, meanwhile: lost at
	// once if the time is up.
	l.giveBackAll(ctx)
	n := l.closeLostPrefetches.Load()
	if n == 0 {
		return nil
	}
	l.mu.Lock()
	cause := l.closeErr
	l.mu.Unlock()
	if !errors.Is(cause, ErrUnavailable) && outage.Is(cause) {
		cause = fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	return errorf("close: %d events of %d prefetches not given back (they count as used until their state expires): %w",
		l.closeLost.Load(), n, cause)
}

// giveBackAll takes every prefetch held off its key and settles it, final,
// prefetchCloseWorkers at a time, within ctx.
func (l *prefetcher) giveBackAll(ctx context.Context) {
	l.mu.Lock()
	all := make([]*prefetch, 0, len(l.held))
	for pf := range l.held {
		if !pf.settling {
			all = append(all, pf)
		}
	}
	l.back = nil
	l.mu.Unlock()
	next := make(chan *prefetch)
	var wg sync.WaitGroup
	for range min(len(all), prefetchCloseWorkers) {
		wg.Go(func() {
			for pf := range next {
				l.detach(pf)
				l.settle(ctx, pf, true)
			}
		})
	}
	for _, pf := range all {
		next <- pf
	}
	close(next)
	wg.Wait()
}
