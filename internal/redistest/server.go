package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startTimeout bounds how long a start or restart waits for the server.
	startTimeout = 5 * time.Second
	// rebindTimeout bounds how long Restart retries a busy port.
	rebindTimeout = 2 * time.Second
	// stopTimeout bounds how long Close waits after SIGTERM before SIGKILL.
	stopTimeout = 10 * time.Second
	// cliTimeout bounds one CLI call (redis-cli waits forever on a paused server).
	cliTimeout = 10 * time.Second
)

// Server is a redis-server child process listening on 127.0.0.1.
//
// The methods are safe for concurrent use. After Kill or Close the server
// keeps its address, and Restart starts it again on the same port.
type Server struct {
	// Addr is "127.0.0.1:<Port>".
	Addr string
	// Port is the TCP port; it does not change across restarts.
	Port int
	// Dir is the server's working directory (--dir). It holds redis.log,
	// stderr.log, any RDB file written by SAVE and, for cluster nodes,
	// nodes.conf. Kill keeps it, so a restart reloads an RDB saved before;
	// Close removes it.
	Dir string

	prog string   // the server program, an absolute path
	args []string // its arguments after the fixed ones

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil when not running
	done   chan struct{} // closed when cmd has been reaped
	paused bool
}

// Start starts redis-server on a free port with the extra args (for example
// "--maxmemory", "2mb"), waits until it answers PING (up to 5 s) and
// registers a cleanup that closes it. It calls [Require] first and fails the
// test if the server does not start.
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	Require(tb)
	s, err := StartServer(args...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// StartServer is [Start] without a testing.TB, for servers shared by a
// package's tests and started in TestMain. The caller must Close the server.
// The error wraps [ErrNotInstalled] when redis-server is not on the PATH.
func StartServer(args ...string) (*Server, error) {
	return startServer(false, args)
}

// startServer starts a server; bus says that port+10000 must be free too.
// A port found busy at bind time is replaced by a new one.
func startServer(bus bool, args []string) (*Server, error) {
	prog, err := serverPath()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	var lastErr error
	for range 10 {
		port, err := freePort(bus)
		if err != nil {
			_ = os.RemoveAll(dir) // err is the one to report
			return nil, err
		}
		s := &Server{
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			Port: port,
			Dir:  dir,
			prog: prog,
			args: append([]string(nil), args...),
		}
		s.mu.Lock()
		lastErr = s.launchLocked(startTimeout, true)
		s.mu.Unlock()
		if lastErr == nil {
			return s, nil
		}
		if !errors.Is(lastErr, errAddrInUse) {
			break
		}
	}
	_ = os.RemoveAll(dir) // lastErr is the one to report
	return nil, lastErr
}

// errAddrInUse marks a start that failed because the port was taken.
var errAddrInUse = errors.New("address already in use")

// launchLocked starts the process and waits until it answers PING with PONG
// (pong) or with any reply, LOADING included (!pong). s.mu is held.
func (s *Server) launchLocked(timeout time.Duration, pong bool) error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	logPath := filepath.Join(s.Dir, "redis.log")
	errPath := filepath.Join(s.Dir, "stderr.log")
	logOff := fileSize(logPath)
	stderr, err := os.OpenFile(errPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}

	argv := []string{
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.Dir,
		"--logfile", logPath,
	}
	argv = append(argv, s.args...)
	cmd := exec.Command(s.prog, argv...)
	cmd.Dir = s.Dir
	cmd.Stdout = stderr
	cmd.Stderr = stderr
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	// The child has its own copy of stderr, read back from errPath. (Closed
	// here, not deferred: the goroutine below stays launchLocked.func1, the
	// name the tests' leak checks ignore.)
	_ = stderr.Close()
	if err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.prog, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // an exit, stopped or not: done is what matters
		close(done)
	}()
	s.cmd, s.done, s.paused = cmd, done, false

	if err := waitReady(s.Addr, done, timeout, pong); err != nil {
		_ = s.stopLocked(syscall.SIGKILL) // err is the one to report
		tail := readFrom(logPath, logOff) + readFrom(errPath, 0)
		if strings.Contains(tail, "Address already in use") {
			err = errAddrInUse
		}
		return fmt.Errorf("redistest: redis-server on %s: %w\n%s", s.Addr, err, lastLines(tail, 15))
	}
	return nil
}

// waitReady polls addr with PING until it gets PONG (or, with !pong, any
// reply), the process exits (done closes) or timeout passes.
func waitReady(addr string, done <-chan struct{}, timeout time.Duration, pong bool) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		select {
		case <-done:
			return errors.New("process exited")
		default:
		}
		r, err := do(addr, 500*time.Millisecond, "PING")
		if err == nil && r == "PONG" {
			return nil
		}
		var re redisError
		if !pong && errors.As(err, &re) {
			return nil // LOADING or similar: it accepts connections
		}
		if err == nil {
			err = fmt.Errorf("PING replied %v", r)
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, lastErr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// PID returns the process id of the running server, or 0 when it is not
// running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.runningLocked() {
		return 0
	}
	return s.cmd.Process.Pid
}

// runningLocked reports whether the process is started and not reaped.
func (s *Server) runningLocked() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// live reports whether the server runs and is not paused.
func (s *Server) live() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runningLocked() && !s.paused
}

// Kill simulates a crash: it sends SIGKILL to the server's process group and
// waits until the process is reaped. Its directory is kept. Killing a server
// that is not running does nothing.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(syscall.SIGKILL)
}

// Close stops the server with SIGTERM (SIGKILL if it has not exited after
// 10 s), waits until it is reaped and removes its directory. It may be called
// more than once; [Server.Restart] after Close starts an empty server on the
// same port.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.stopLocked(syscall.SIGTERM)
	if rerr := os.RemoveAll(s.Dir); err == nil && rerr != nil {
		err = fmt.Errorf("redistest: %w", rerr)
	}
	return err
}

// stopLocked signals the process with sig and waits until it is reaped.
func (s *Server) stopLocked(sig syscall.Signal) error {
	if s.cmd == nil {
		return nil
	}
	cmd, done := s.cmd, s.done
	s.cmd, s.done, s.paused = nil, nil, false
	select {
	case <-done:
		return nil // it had already exited
	default:
	}
	pid := cmd.Process.Pid
	if sig == syscall.SIGKILL {
		// The process is not reaped yet (at worst a zombie), so its pid,
		// which is also its process group id, cannot have been reused.
		_ = syscall.Kill(-pid, syscall.SIGKILL) // fails only if it exited: done tells
	} else {
		_ = cmd.Process.Signal(sig)             // fails only if it exited: done tells
		_ = cmd.Process.Signal(syscall.SIGCONT) // a paused server must run to exit
	}
	select {
	case <-done:
		return nil
	case <-time.After(stopTimeout):
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL) // fails only if it exited: done tells
	<-done
	return fmt.Errorf("redistest: redis-server %d ignored %v for %v; killed", pid, sig, stopTimeout)
}

// Restart starts the server again on the same port with the same arguments,
// after Kill or Close, and waits until it accepts connections (a server still
// loading a big RDB answers LOADING, and Restart returns then). If the port is
// busy it retries for about 2 s.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runningLocked() {
		return fmt.Errorf("redistest: restart %s: still running", s.Addr)
	}
	deadline := time.Now().Add(rebindTimeout)
	for {
		err := s.launchLocked(startTimeout, false)
		if err == nil || !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Pause stops the process with SIGSTOP, which looks like a hung server: the
// kernel still accepts connections, but nothing is answered.
func (s *Server) Pause() error {
	return s.signal(syscall.SIGSTOP, true)
}

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() error {
	return s.signal(syscall.SIGCONT, false)
}

func (s *Server) signal(sig syscall.Signal, paused bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.runningLocked() {
		return fmt.Errorf("redistest: %v %s: not running", sig, s.Addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redistest: %v %s: %w", sig, s.Addr, err)
	}
	s.paused = paused
	return nil
}

// Client returns a go-redis client with default options for setting up and
// inspecting the server in a test. It is closed when the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	tb.Cleanup(func() { c.Close() })
	return c
}

// CLI runs `redis-cli -h 127.0.0.1 -p <Port> args...` (for example
// "CONFIG", "SET", "maxmemory", "2mb"; redis-cli as [CLIEnv] says) and
// returns its output without surrounding white space. redis-cli exits with status 0 on an error reply,
// so CLI returns an error when redis-cli fails or when the reply starts with
// "ERR "; other error replies (WRONGTYPE, NOSCRIPT, ...) come back as output.
// A call gives up after 10 s.
func (s *Server) CLI(args ...string) (string, error) {
	cli, err := cliPath()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	argv := append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.Port)}, args...)
	out, err := exec.CommandContext(ctx, cli, argv...).CombinedOutput()
	res := strings.TrimSpace(string(out))
	if err != nil {
		return res, fmt.Errorf("redistest: redis-cli -p %d %s: %w: %s", s.Port, strings.Join(args, " "), err, res)
	}
	if strings.HasPrefix(res, "ERR ") {
		return res, fmt.Errorf("redistest: redis-cli -p %d %s: %s", s.Port, strings.Join(args, " "), res)
	}
	return res, nil
}

// String returns the server's address.
func (s *Server) String() string { return s.Addr }

// do sends one command to addr on a fresh connection and returns the reply
// (string, int64, []any, nil, or a redisError as the error). It starts no
// goroutine and leaves nothing behind.
func do(addr string, timeout time.Duration, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }() // after the reply: nothing to lose
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(conn))
}

// redisError is an error reply.
type redisError string

func (e redisError) Error() string { return string(e) }

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	switch body := line[1:]; line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, redisError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}

// doString is do for commands that answer with a string.
func doString(addr string, args ...string) (string, error) {
	r, err := do(addr, 500*time.Millisecond, args...)
	if err != nil {
		return "", err
	}
	s, ok := r.(string)
	if !ok {
		return "", fmt.Errorf("%s: reply %T, want string", args[0], r)
	}
	return s, nil
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns the file's content from offset off (at most 64 KiB).
func readFrom(path string, off int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }() // read only: its Close loses nothing
	b, _ := io.ReadAll(io.LimitReader(io.NewSectionReader(f, off, 1<<16), 1<<16))
	return string(b)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
