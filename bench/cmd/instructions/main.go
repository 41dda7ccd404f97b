// Command instructions counts the CPU instructions redis-server executes
// per decision for each contender, under valgrind's callgrind: a count that,
// unlike time, does not move when other jobs share the machine, so that a
// change to a script shows as a figure, not as noise.
//
//	go run ./cmd/instructions [-n 2000] [-workload one] [-only regexp] [-out instructions.md] [-keep dir] [-variants dir,...]
//	go run ./cmd/instructions -library cmd/instructions/costs.lua -functions ret,floor10,mod10 [-n 2000] [-workload keys] [-eval]
//
// With -keep, each contender's (or -library function's) callgrind dump is
// kept in dir (named after it) for callgrind_annotate, which shows where its
// instructions went, function by function.
//
// With -variants, each redlimit contender that runs a script is also
// counted with its script rebuilt from another copy of scripts/*.lua (as
// cmd/compare's -variants does): a change to a script shows as a figure
// before it is made.
//
// With -library, it measures instead each function that -functions names
// in that Redis Functions library (FCALL with the keys {k}1, {k}2 and
// {k}3, or the first -keys of them, no arguments, on an emptied database): what a piece of Lua or a
// command costs Redis, as the difference from a function that returns at
// once (costs.lua holds the ones BENCHMARKS.md quotes). With -workload
// keys, every call has keys of its own ({u<i>}1, {u<i>}2, {u<i>}3, i
// counting the calls), none of them seen before. With -eval, each
// function's body (the lines between its register_function line and the
// first line after it that is "end)", or the rest of a function written
// on one line) runs instead as a script, with EVALSHA: what the same
// decision costs as a script (floors.lua holds the least a decision can
// cost, issue 40).
//
// It starts its own redis-server under callgrind on a free loopback port
// (valgrind and redis-server on the PATH) and stops it when done. For each
// contender it empties the database, starts the scripts' Lua interpreter
// afresh (SCRIPT FLUSH: what one contender leaves in it does not weigh on
// the next), makes 50 decisions to load its script, then zeroes the
// counters, makes -n decisions one after the other, and reads the total
// (callgrind_control); the same wait with no decisions is measured and
// subtracted, so that the server's own timers do not count. A figure is
// the whole request in redis-server's user space: reading and parsing the
// command, the script or command, and the reply (not the kernel's work).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "instructions:", err)
		os.Exit(1)
	}
}

// flags are the command's flags.
var flags = struct {
	n                            *int
	workload, only, out, keep    *string
	library, functions, variants *string
	nkeys                        *int
	eval                         *bool
}{
	n:         flag.Int("n", 2000, "decisions per contender"),
	workload:  flag.String("workload", "one", "workload: one or keys"),
	only:      flag.String("only", "", "regexp: count only the contenders whose name matches"),
	out:       flag.String("out", "", "also write the Markdown table to this file"),
	keep:      flag.String("keep", "", "keep each contender's callgrind dump in this directory"),
	library:   flag.String("library", "", "instead of the contenders, measure the functions of this Redis Functions library (a file)"),
	functions: flag.String("functions", "", "with -library: comma-separated names of its functions to measure"),
	nkeys:     flag.Int("keys", 3, "with -library: how many keys each call passes (1 to 3)"),
	eval:      flag.Bool("eval", false, "with -library: run each function's body as a script (EVALSHA) instead of calling it with FCALL"),
	variants:  flag.String("variants", "", "comma-separated directories holding other versions of the library's scripts/*.lua: each scripted redlimit contender is also counted with its script built from them"),
}

func run() error {
	flag.Parse()
	var match *regexp.Regexp
	if *flags.only != "" {
		var err error
		if match, err = regexp.Compile(*flags.only); err != nil {
			return err
		}
	}
	if err := checkTools(); err != nil {
		return err
	}
	w, err := bench.MakeWorkload(*flags.workload, 10_000, 1_000_000)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "redlimit-callgrind")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }() // a temporary directory: nothing to report
	srv, err := startServer(dir)
	if err != nil {
		return err
	}
	defer srv.stop()

	opts := &redis.Options{PoolSize: 4, DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute, PoolTimeout: time.Minute}
	env, err := bench.NewEnv(srv.addr, opts, false)
	if err != nil {
		return err
	}
	defer env.Close()
	if *flags.library != "" {
		return srv.library(env, *flags.library, *flags.functions, *flags.nkeys, w.Name == "keys", *flags.eval, *flags.n, *flags.keep)
	}

	table, err := srv.table(env, w, match)
	if err != nil {
		return err
	}
	fmt.Print(table)
	if *flags.out != "" {
		return os.WriteFile(*flags.out, []byte(table), 0o644)
	}
	return nil
}

// table counts the contenders on workload w (those match matches, when
// set, and INCR), -n decisions each, and returns the Markdown table.
func (s *server) table(env *bench.Env, w *bench.Workload, match *regexp.Regexp) (string, error) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "redis-server instructions per decision (callgrind), workload `%s`, %d decisions each, one at a time.\n\n", w.Name, *flags.n)
	sb.WriteString("| contender | instructions per decision |\n|---|---:|\n")
	for _, c := range contenders(*flags.variants) {
		if match != nil && !match.MatchString(c.Name) && c.Name != "INCR" {
			continue
		}
		per, err := s.countKept(env, c, w, *flags.n, *flags.keep)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&sb, "| %s | %.0f |\n", c.Name, per)
	}
	return sb.String(), nil
}

// checkTools checks that the programs the command runs are on the PATH.
func checkTools() error {
	for _, tool := range []string{"valgrind", "callgrind_control", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not on the PATH", tool)
		}
	}
	return nil
}

// contenders returns what the command counts: the benchmark's contenders,
// a few more of redlimit's, and each scripted one of redlimit's built from
// each directory of variants (comma-separated), if any.
func contenders(variants string) []bench.Contender {
	cs := append(bench.Contenders(), bench.More()...)
	cs = append(cs, bench.RedlimitClientClock(redlimit.TokenBucket),
		bench.RedlimitRegions(redlimit.TokenBucket), bench.RedlimitRegions(redlimit.FixedWindow))
	if variants == "" {
		return cs
	}
	for _, dir := range strings.Split(variants, ",") {
		for _, c := range cs {
			if c.Scripted && c.Kind == "redlimit" && !strings.Contains(c.Name, "[") && !strings.Contains(c.Name, "(functions)") {
				cs = append(cs, bench.Variant(c, dir))
			}
		}
	}
	return cs
}

// countKept returns the instructions per decision of contender c (see
// count), printed on stderr as it goes; with keep, the callgrind dump is
// kept in that directory.
func (s *server) countKept(env *bench.Env, c bench.Contender, w *bench.Workload, n int, keep string) (float64, error) {
	per, dump, err := s.count(context.Background(), env, c, w, n)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", c.Name, err)
	}
	if keep != "" {
		if err := keepDump(dump, keep, c.Name); err != nil {
			return 0, err
		}
	}
	fmt.Fprintf(os.Stderr, "%s: %.0f\n", c.Name, per)
	return per, nil
}

// server is a redis-server running under callgrind.
type server struct {
	cmd  *exec.Cmd
	addr string
	dir  string // where callgrind writes its dumps
}

func startServer(dir string) (*server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close() // only its port was wanted
	cmd := exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+filepath.Join(dir, "callgrind.out"),
		"redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, addr: "127.0.0.1:" + port, dir: dir}
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, MaxRetries: -1})
	defer rdb.Close()
	for deadline := time.Now().Add(time.Minute); ; {
		if rdb.Ping(context.Background()).Err() == nil {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, errors.New("redis-server under valgrind did not answer within a minute")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stop ends the server by its PID.
func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM) // fails only if it exited: done tells
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }() // stopped: its exit status says nothing more
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

// count returns the instructions per decision of contender c and the
// callgrind dump they were read from.
func (s *server) count(ctx context.Context, env *bench.Env, c bench.Contender, w *bench.Workload, n int) (float64, string, error) {
	if err := env.Admin.FlushAll(ctx).Err(); err != nil {
		return 0, "", err
	}
	// A new Lua interpreter for scripts: one that holds the scripts of
	// the contenders measured before made a later one's garbage
	// collection cost more (a Sheddable share measured after the plain
	// strategies counted 3,900 instructions more, alone 700 more).
	if err := env.Admin.ScriptFlush(ctx).Err(); err != nil {
		return 0, "", err
	}
	dec, release, err := c.Setup(env, w)
	if err != nil {
		return 0, "", err
	}
	if release != nil {
		defer release()
	}
	return s.measure(func(k int) error {
		for i := range k {
			if _, err := dec(ctx, i%len(w.Keys)); err != nil {
				return err
			}
		}
		return nil
	}, n)
}

// library loads the Redis Functions library in file and prints the
// instructions per call of each of its functions that names lists: called
// with FCALL, or with eval, its body run as a script by EVALSHA; on the
// same nkeys keys every call, or with fresh, new keys for each call. Each
// function's script runs on a fresh Lua interpreter, as each contender's
// does.
func (s *server) library(env *bench.Env, file, names string, nkeys int, fresh, eval bool, n int, keep string) error {
	if nkeys < 1 || nkeys > 3 {
		return fmt.Errorf("-keys %d: want 1 to 3", nkeys)
	}
	ctx := context.Background()
	code, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := env.Admin.FunctionLoad(ctx, string(code)).Err(); err != nil {
		return err
	}
	keys := []string{"{k}1", "{k}2", "{k}3"}[:nkeys]
	calls := 0
	for _, name := range strings.Split(names, ",") {
		if err := env.Admin.FlushAll(ctx).Err(); err != nil { // keeps the library
			return err
		}
		if err := env.Admin.ScriptFlush(ctx).Err(); err != nil { // each body on a fresh interpreter
			return err
		}
		call := func(keys []string) *redis.Cmd { return env.Admin.FCall(ctx, name, keys) }
		if eval {
			body, err := functionBody(string(code), name)
			if err != nil {
				return err
			}
			script := redis.NewScript(body)
			call = func(keys []string) *redis.Cmd { return script.Run(ctx, env.Admin, keys) }
		}
		per, err := s.measureKept(func(k int) error {
			for range k {
				if fresh {
					calls++
					tag := "{u" + strconv.Itoa(calls) + "}"
					keys = []string{tag + "1", tag + "2", tag + "3"}[:nkeys]
				}
				if err := call(keys).Err(); err != nil && !errors.Is(err, redis.Nil) {
					return err
				}
			}
			return nil
		}, n, keep, name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Printf("%-12s %8.0f\n", name, per)
	}
	return nil
}

// functionBody returns the body of the function registered as name in a
// library's code: from after "function(...)" on its register_function
// line to the first line after it that is "end)" (or, for a function on
// one line, to its closing "end)").
func functionBody(code, name string) (string, error) {
	head := regexp.MustCompile(`(?m)^redis\.register_function\('` + regexp.QuoteMeta(name) + `', function\([^)]*\)`)
	loc := head.FindStringIndex(code)
	if loc == nil {
		return "", fmt.Errorf("no function %q in the library", name)
	}
	rest := code[loc[1]:]
	if line, _, _ := strings.Cut(rest, "\n"); strings.HasSuffix(strings.TrimSpace(line), "end)") {
		line = strings.TrimSpace(line)
		return strings.TrimSuffix(line, "end)"), nil
	}
	body, _, ok := strings.Cut(rest, "\nend)")
	if !ok {
		return "", fmt.Errorf("function %q has no line \"end)\"", name)
	}
	return body, nil
}

// measureKept is measure, with the dump kept in dir keep (unless "")
// under name.
func (s *server) measureKept(decide func(k int) error, n int, keep, name string) (float64, error) {
	per, dump, err := s.measure(decide, n)
	if err == nil && keep != "" {
		err = keepDump(dump, keep, name)
	}
	return per, err
}

// measure returns the instructions per call of decide(1) (which makes k
// calls in decide(k)) and the callgrind dump they were read from.
func (s *server) measure(decide func(k int) error, n int) (float64, string, error) {
	if err := decide(50); err != nil { // loads the script
		return 0, "", err
	}
	if err := s.control("-z"); err != nil {
		return 0, "", err
	}
	start := time.Now()
	if err := decide(n); err != nil {
		return 0, "", err
	}
	elapsed := time.Since(start)
	busy, dump, err := s.total()
	if err != nil {
		return 0, "", err
	}
	if err := s.control("-z"); err != nil { // the same wait, idle
		return 0, "", err
	}
	time.Sleep(elapsed)
	idle, _, err := s.total()
	if err != nil {
		return 0, "", err
	}
	return float64(busy-idle) / float64(n), dump, nil
}

func (s *server) control(arg string) error {
	out, err := exec.Command("callgrind_control", arg, strconv.Itoa(s.cmd.Process.Pid)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("callgrind_control %s: %v: %s", arg, err, out)
	}
	return nil
}

// total dumps the counters and returns the instructions since they were
// last zeroed, and the dump's file.
func (s *server) total() (uint64, string, error) {
	before, _ := filepath.Glob(filepath.Join(s.dir, "callgrind.out.*"))
	if err := s.control("-d"); err != nil {
		return 0, "", err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		files, _ := filepath.Glob(filepath.Join(s.dir, "callgrind.out.*"))
		if len(files) <= len(before) {
			continue
		}
		newest := files[0]
		for _, f := range files {
			if dumpNumber(f) > dumpNumber(newest) {
				newest = f
			}
		}
		if v, ok := readTotals(newest); ok {
			return v, newest, nil
		}
	}
	return 0, "", errors.New("no callgrind dump with totals appeared")
}

// keepDump copies a contender's dump into dir, named after the contender.
func keepDump(dump, dir, name string) error {
	data, err := os.ReadFile(dump)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	file := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, name)
	return os.WriteFile(filepath.Join(dir, file+".callgrind"), data, 0o644)
}

// dumpNumber is the sequence number callgrind puts at the end of a dump's name.
func dumpNumber(name string) int {
	i := strings.LastIndex(name, ".")
	v, _ := strconv.Atoi(name[i+1:])
	return v
}

// readTotals reads the "totals:" line of a callgrind dump, once it is
// complete.
func readTotals(name string) (uint64, bool) {
	f, err := os.Open(name)
	if err != nil {
		return 0, false
	}
	defer func() { _ = f.Close() }() // read only: its Close loses nothing
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "totals: "); ok {
			n, err := strconv.ParseUint(strings.Fields(v)[0], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
