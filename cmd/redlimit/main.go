// Command redlimit compares, benchmarks and inspects the rate limiters of
// package github.com/redlimit/redlimit.
//
// Usage:
//
//	redlimit <command> [flags] [arguments]
//
// The commands are:
//
//	simulate   replay a traffic pattern through all six strategies and chart it
//	bench      measure decisions per second and latency of each strategy
//	inspect    show the decision and the Redis keys of one limited key
//	reset      forget the state of one limited key
//	check      tell whether a Redis may evict limiter keys
//
// Run "redlimit help <command>" for the flags of a command. Errors are
// printed on standard error as one line starting with "redlimit: ". The exit
// status is 0 on success, 1 when the command failed and 2 for a usage error.
//
// The chart in the repository's README, docs/simulate.png, is made by
// "go generate" in this directory (see the go:generate line in simulate.go),
// which runs:
//
//	go run . simulate -pattern bursty -rate 10 -period 1s -duration 6s -out ../../docs/simulate.png
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// command is one subcommand of redlimit.
type command struct {
	name  string // as typed: "simulate"
	args  string // what follows the flags in the usage line: "[flags] KEY"
	short string // one line for the command list
	long  string // paragraphs for "redlimit help <name>", before the flags

	// setup defines the command's flags in fs and returns the function that
	// runs the command once fs is parsed, with the arguments left over.
	setup func(fs *flag.FlagSet) runFunc
}

// runFunc runs a command. It returns a *usageError for a mistake in the
// command line, and any other error for a failure.
type runFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// usageError is a mistake in the command line: it makes redlimit exit with
// status 2 and point to the command's help.
type usageError struct {
	cmd string // the command, or "" for the top level
	msg string
}

func (e *usageError) Error() string {
	if e.cmd == "" {
		return e.msg
	}
	return e.cmd + ": " + e.msg
}

// usagef returns a *usageError for command cmd.
func usagef(cmd, format string, args ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, args...)}
}

// commands lists the subcommands in the order "redlimit help" shows them.
var commands = []*command{simulateCmd, benchCmd, inspectCmd, resetCmd, checkCmd}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func main() {
	// go-redis logs dial failures on its own; redlimit reports them in
	// its one line instead.
	redis.SetLogger(quietLogger{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command line args (without the program name) and returns the
// exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := dispatch(ctx, args, stdout, stderr)
	var uerr *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &uerr):
		fmt.Fprintf(stderr, "redlimit: %v\n", uerr)
		if c := lookup(uerr.cmd); c != nil {
			fmt.Fprintf(stderr, "usage: redlimit %s %s\nRun 'redlimit help %s' for details.\n", c.name, c.args, c.name)
		} else {
			fmt.Fprintln(stderr, "Run 'redlimit help' for usage.")
		}
		return 2
	default:
		fmt.Fprintf(stderr, "redlimit: %v\n", oneLine(err))
		return 1
	}
}

// dispatch finds the command named by args[0] and runs it.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		printUsage(stderr)
		return usagef("", "no command given")
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		return help(rest, stdout)
	}
	c := lookup(name)
	if c == nil {
		return usagef("", "unknown command %q", name)
	}
	fs := newFlagSet(c)
	runCmd := c.setup(fs)
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printHelp(c, stderr)
			return err
		}
		return usagef(c.name, "%v", err)
	}
	err := runCmd(ctx, fs.Args(), stdout, stderr)
	if errors.Is(err, redlimit.ErrInvalidLimit) || errors.Is(err, redlimit.ErrInvalidArgument) {
		// The limit and the options come from the flags.
		return usagef(c.name, "%s", trimPrefix(err))
	}
	return err
}

// newFlagSet returns a silent flag set for c: errors are reported by run,
// and help by printHelp.
func newFlagSet(c *command) *flag.FlagSet {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// help implements "redlimit help [command]".
func help(args []string, w io.Writer) error {
	switch len(args) {
	case 0:
		printUsage(w)
		return nil
	case 1:
		c := lookup(args[0])
		if c == nil {
			return usagef("", "unknown help topic %q", args[0])
		}
		printHelp(c, w)
		return nil
	}
	return usagef("", "help takes at most one command")
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, "Redlimit compares, benchmarks and inspects redlimit rate limiters.\n\n")
	fmt.Fprint(w, "Usage:\n\n\tredlimit <command> [flags] [arguments]\n\nThe commands are:\n\n")
	for _, c := range commands {
		fmt.Fprintf(w, "\t%-10s %s\n", c.name, c.short)
	}
	fmt.Fprint(w, "\nUse \"redlimit help <command>\" for more information about a command.\n")
}

func printHelp(c *command, w io.Writer) {
	fmt.Fprintf(w, "usage: redlimit %s %s\n\n%s\n", c.name, c.args, strings.TrimSpace(c.long))
	fs := newFlagSet(c)
	c.setup(fs)
	fmt.Fprint(w, "\nFlags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// oneLine returns the message of err on one line, without the package's
// "redlimit: " prefixes, which run prints once.
func oneLine(err error) string {
	return strings.Join(strings.Fields(trimPrefix(err)), " ")
}

// trimPrefix returns the message of err without the "redlimit: " prefixes
// that errors of package redlimit start with.
func trimPrefix(err error) string {
	return strings.ReplaceAll(err.Error(), "redlimit: ", "")
}

// quietLogger discards go-redis's log messages.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
