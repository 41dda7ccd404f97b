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
	delay     time.Duration
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

// chunk is data read from the server, due for the client at due.
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
	queue := make(chan chunk, 64)
	wg.Go(func() { p.toServer(pc, server) })
	wg.Go(func() { p.fromServer(pc, server, queue) })
	wg.Go(func() { p.toClient(pc, queue) })
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

// toServer copies what the client sends to server (but in a black hole),
// and closes pc when either side fails.
func (p *Proxy) toServer(pc *proxyConn, server net.Conn) {
	defer pc.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := pc.client.Read(buf)
		if n > 0 && !p.drop(pc) {
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// fromServer queues what server sends (but in a black hole), each chunk
// due after the proxy's delay, and closes queue when server's side ends.
func (p *Proxy) fromServer(pc *proxyConn, server net.Conn, queue chan<- chunk) {
	defer close(queue)
	for {
		buf := make([]byte, 32<<10)
		n, err := server.Read(buf)
		if n > 0 && !p.drop(pc) {
			select {
			case queue <- chunk{buf[:n], time.Now().Add(p.getDelay())}:
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

// toClient writes each chunk of queue to the client at its due time, and
// closes pc when the queue or the client ends.
func (p *Proxy) toClient(pc *proxyConn, queue <-chan chunk) {
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
		if _, err := pc.client.Write(c.data); err != nil {
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

func (p *Proxy) getDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
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
	p.delay = 0
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
