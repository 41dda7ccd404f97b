// Command lanes prints, for test.sh, the tests of the package in a
// directory by lane (see internal/testlane): one line per lane, its name
// and a regular expression for go test's -run and -skip that matches its
// tests exactly ("^$" for a lane with none):
//
//	alone ^(TestClusterFailover|TestFaultCrash|...)$
//	servers ^(TestBehaviourRedis|...)$
//	heavy ^(...)$
//	cpu ^(...)$
//
// Usage: go run ./internal/testlane/lanes [DIR] (the current directory by
// default).
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/redlimit/redlimit/internal/testlane"
)

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	lanes, err := testlane.Classify(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lanes:", err)
		os.Exit(1)
	}
	for _, l := range []testlane.Lane{testlane.Alone, testlane.Servers, testlane.Heavy, testlane.CPU} {
		fmt.Printf("%s %s\n", l, pattern(testlane.Select(lanes, l)))
	}
}

// pattern returns a regular expression that matches exactly the names.
func pattern(names []string) string {
	if len(names) == 0 {
		return "^$"
	}
	return "^(" + strings.Join(names, "|") + ")$"
}
