// Package testlane sorts a package's tests into the lanes that test.sh runs
// side by side, from what each test calls, so that no list of test names
// has to be kept up to date:
//
//   - [Alone]: tests that a busy machine would skew (servers killed, paused
//     or cut with bounds on what the fault adds to a call, clusters failing
//     over, CPU measured). A test is in it when it calls [MarkAlone], or
//     starts a Redis Cluster (redistest.StartCluster: six processes).
//   - [Servers]: the other tests that start a redis-server: they call
//     redistest's Start, StartServer, Require or ServerVersion (redistest
//     calls [MarkServer] in Require and SkipOrFail, which the others are
//     used with).
//   - [Heavy]: long tests with no real Redis (miniredis with an exact
//     clock, no short timeouts), which test.sh runs all along at the lowest
//     priority. A test is in it when it calls [MarkHeavy].
//   - [CPU]: every other test.
//
// A test calls these directly or through helpers of its package: [Classify]
// follows the package's own functions and variables. The cmd/lanes command
// prints each lane's tests for test.sh.
//
// The marks also check, at run time, that a test runs in its lane: a test
// binary run with REDLIMIT_TEST_LANE set to a lane fails a test whose mark
// belongs to a lane above it (a test that starts a server in the cpu lane,
// say), which is what a miss of the analysis would look like. Without the
// variable (go test, and test.sh's reruns on other engines) every test
// runs.
package testlane

import (
	"os"
	"testing"
)

// Lane is a set of tests that test.sh runs in one process.
type Lane string

// The lanes, from the lowest to the highest: a test belongs to the highest
// lane of its marks.
const (
	CPU     Lane = "cpu"
	Heavy   Lane = "heavy"
	Servers Lane = "servers"
	Alone   Lane = "alone"
)

// Env is the environment variable that names the lane a test binary runs
// (test.sh sets it). Unset, every test runs and the marks check nothing.
const Env = "REDLIMIT_TEST_LANE"

// rank orders the lanes; an unknown lane ranks as CPU.
func (l Lane) rank() int {
	switch l {
	case Heavy:
		return 1
	case Servers:
		return 2
	case Alone:
		return 3
	}
	return 0
}

// MarkAlone puts the calling test in the Alone lane: it measures what a
// busy machine would skew, so it runs with no other test beside it.
func MarkAlone(tb testing.TB) {
	tb.Helper()
	check(tb, Alone, "MarkAlone")
}

// MarkServer puts the calling test in the Servers lane (at least): it
// starts a redis-server. internal/redistest calls it.
func MarkServer(tb testing.TB) {
	tb.Helper()
	check(tb, Servers, "MarkServer")
}

// MarkHeavy puts the calling test in the Heavy lane: it runs long, with no
// real Redis and no short timeouts, at the lowest priority.
func MarkHeavy(tb testing.TB) {
	tb.Helper()
	check(tb, Heavy, "MarkHeavy")
}

// check fails tb when the binary runs a lane below l: the analysis that
// chose the test for that lane missed the mark.
func check(tb testing.TB, l Lane, mark string) {
	tb.Helper()
	running := Lane(os.Getenv(Env))
	if !misplaced(l, running) {
		return
	}
	tb.Fatalf("testlane: %s calls %s, which belongs in the %s lane, but runs in the %s lane (%s=%s): "+
		"internal/testlane's analysis missed the call; see CONTRIBUTING.md", tb.Name(), mark, l, running, Env, running)
}

// misplaced reports whether a test marked for lane l must not run in the
// lane running ("" when every test runs): l is above it.
func misplaced(l, running Lane) bool {
	return running != "" && l.rank() > running.rank()
}
