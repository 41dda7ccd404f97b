package redistest

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy for fault injection. It listens on a free loopback
// port and forwards each connection to a target address; its methods cut,
// black-hole or slow the traffic. The methods are safe for concurrent use.
type Proxy struct {
	// Addr is the proxy's "127.0.0.1:<port>"; it does not change across
	// Cut and Restore.
	Addr string

	target string

	mu        sync.Mutex
	ln        net.Listener  // nil while cut or closed
	lnDone    chan struct{} // closed when ln's accept loop has returned
	conns     map[*proxyConn]struct{}
	blackhole bool
	delay     time.Duration // server to client
	upDelay   time.Duration // client to server
	closed    bool
	wg        sync.WaitGroup // accept loops and connection goroutines
}

// proxyConn is one proxied connection.
type proxyConn struct {
	client net.Conn
	server net.Conn // nil until dialled
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	// tainted is set when bytes were dropped in a black hole: the streams
	// are out of step, so the connection is closed when the hole ends.
	tainted bool
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.done)
		_ = c.client.Close() // a cut: what the close says is no matter
		c.mu.Lock()
		if c.server != nil {
			_ = c.server.Close()
		}
		c.mu.Unlock()
	})
}

// NewProxy starts a proxy to target on a free loopback port and registers a
// cleanup that closes it.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := newProxy(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

func newProxy(target string) (*Proxy, error) {
	var lastErr error
	for range 10 {
		port, err := freePort(false)
		if err != nil {
			return nil, err
		}
		p := &Proxy{
			Addr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			target: target,
			conns:  make(map[*proxyConn]struct{}),
		}
		ln, err := net.Listen("tcp", p.Addr)
		if err != nil {
			lastErr = err
			continue
		}
		p.mu.Lock()
		p.startLocked(ln)
		p.mu.Unlock()
		return p, nil
	}
	return nil, lastErr
}

// startLocked serves ln. p.mu is held.
func (p *Proxy) startLocked(ln net.Listener) {
	p.ln = ln
	p.lnDone = make(chan struct{})
	p.wg.Add(1)
	go p.serve(ln, p.lnDone)
}

func (p *Proxy) serve(ln net.Listener, done chan struct{}) {
	defer p.wg.Done()
	defer close(done)
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		pc := &proxyConn{client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.ln != ln { // cut or closed meanwhile
			p.mu.Unlock()
			_ = c.Close() // refused: what the close says is no matter
			continue
		}
		p.conns[pc] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(pc)
	}
}

// chunk is data read from one side, due for the other at due.
type chunk struct {
	data []byte
	due  time.Time
}

// handle proxies pc until either side closes it or the proxy cuts it.
func (p *Proxy) handle(pc *proxyConn) {
	defer p.wg.Done()
	defer func() {
		pc.close()
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
	}()
	server := p.dial(pc)
	if server == nil {
		return
	}
	var wg sync.WaitGroup
	up, down := make(chan chunk, 64), make(chan chunk, 64)
	wg.Go(func() { p.read(pc, pc.client, up, &p.upDelay) })
	wg.Go(func() { p.write(pc, server, up) })
	wg.Go(func() { p.read(pc, server, down, &p.delay) })
	wg.Go(func() { p.write(pc, pc.client, down) })
	wg.Wait()
}

// dial connects pc to the target, within 2 s, and returns the connection:
// nil when it failed or pc was closed meanwhile.
func (p *Proxy) dial(pc *proxyConn) net.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	go func() {
		select {
		case <-pc.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var d net.Dialer
	server, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		return nil
	}
	pc.mu.Lock()
	pc.server = server
	pc.mu.Unlock()
	select {
	case <-pc.done: // closed while dialling
		_ = server.Close()
		return nil
	default:
	}
	return server
}

// read queues what from sends (but in a black hole), each chunk due after
// the delay that *delay holds (read under p.mu), and closes queue and pc
// when from's side ends.
func (p *Proxy) read(pc *proxyConn, from net.Conn, queue chan<- chunk, delay *time.Duration) {
	defer close(queue)
	for {
		buf := make([]byte, 32<<10)
		n, err := from.Read(buf)
		if n > 0 && !p.drop(pc) {
			p.mu.Lock()
			due := time.Now().Add(*delay)
			p.mu.Unlock()
			select {
			case queue <- chunk{buf[:n], due}:
			case <-pc.done:
				return
			}
		}
		if err != nil {
			pc.close()
			return
		}
	}
}

// write writes each chunk of queue to to at its due time, and closes pc
// when the queue or to ends.
func (p *Proxy) write(pc *proxyConn, to net.Conn, queue <-chan chunk) {
	defer pc.close()
	for c := range queue {
		if wait := time.Until(c.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-pc.done:
				t.Stop()
				return
			}
		}
		if _, err := to.Write(c.data); err != nil {
			return
		}
	}
}

// drop reports whether data on pc must be dropped because of a black hole,
// and marks pc as out of step if so.
func (p *Proxy) drop(pc *proxyConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole {
		pc.mu.Lock()
		pc.tainted = true
		pc.mu.Unlock()
	}
	return p.blackhole
}

// Cut closes the listener and every open connection: connections in use see
// EOF or a reset, and new dials are refused until [Proxy.Restore]. It
// returns when the listening socket is closed: Go closes it only when the
// accept loop, which holds it, returns, and until then (long, on a loaded
// machine) the kernel would still accept dials.
func (p *Proxy) Cut() {
	p.mu.Lock()
	var done chan struct{}
	if p.ln != nil {
		_ = p.ln.Close() // its accept loop ends on the error
		p.ln, done = nil, p.lnDone
	}
	for pc := range p.conns {
		pc.close()
	}
	p.mu.Unlock()
	if done != nil {
		<-done // not under p.mu, which the accept loop may be waiting for
	}
}

// Restore ends every fault: it listens again on the same port if the proxy
// was cut (retrying for about 2 s if the port is busy), and ends a black hole
// and any delay. Connections that lost bytes in a black hole are closed.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.delay, p.upDelay = 0, 0
	p.endBlackholeLocked()
	if p.ln != nil {
		return
	}
	deadline := time.Now().Add(rebindTimeout)
	for {
		ln, err := net.Listen("tcp", p.Addr)
		if err == nil {
			p.startLocked(ln)
			return
		}
		if time.Now().After(deadline) {
			panic("redistest: proxy cannot listen on " + p.Addr + " again: " + err.Error())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Blackhole with on set makes the proxy accept connections and keep them
// open but forward no byte in either direction, so clients see read timeouts.
// Blackhole(false) forwards again and closes the connections that lost bytes
// (their request and reply streams no longer match).
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.blackhole = true
	} else {
		p.endBlackholeLocked()
	}
}

func (p *Proxy) endBlackholeLocked() {
	p.blackhole = false
	for pc := range p.conns {
		pc.mu.Lock()
		t := pc.tainted
		pc.mu.Unlock()
		if t {
			pc.close()
		}
	}
}

// SetDelay delays every chunk of data forwarded from the server to the
// client by d, measured from when the proxy read it; 0 forwards at once. The
// delay applies to chunks read after the call.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// SetEachWay delays the data forwarded in each direction, to the server and
// to the client, by d: a link that adds 2d to a round trip. It applies to
// chunks read after the call.
func (p *Proxy) SetEachWay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay, p.upDelay = d, d
}

// Close stops the proxy, closes every connection and waits for its
// goroutines to end. It may be called more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		_ = p.ln.Close() // its accept loop ends on the error
		p.ln = nil
	}
	for pc := range p.conns {
		pc.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
