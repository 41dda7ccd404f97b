#!/usr/bin/env bash
# The one test command (see CONTRIBUTING.md). It runs every module's tests with
# -race, every command of the docs and of the examples' doc comments, the
# release check, the linter (.ci/lint.sh), and the micro-benchmarks once
# each (to keep them working, not to judge speed). Tests that need redis-server start their own on free
# loopback ports; with REDLIMIT_REQUIRE_REDIS=1 they fail, instead of
# skipping, when redis-server is not installed.
#
# REDLIMIT_ENGINES (colon-separated redis-server programs, as
# `.ci/engines.sh --paths` prints them; CI sets it) runs the root package's
# real-Redis tests once more with every limiter on Redis Functions, then
# those tests and the test harness once more on each of those engines,
# after the normal run. Without it each assertion runs once: Redis
# Functions are then tested by their own tests (functions_test.go).
#
# The release check, the micro-benchmarks and the linter run in the
# background at the lowest priority from the start (no timing depends on
# them), on what the docs' commands and the tests leave of the 2 cores;
# their output is shown at the end. The tests run after the docs'
# commands, in lanes (see below).
set -euo pipefail
cd "$(dirname "$0")"

modules=(. grpclimit cmd/redlimit bench examples/prometheus extra/redlimitotel extra/redlimitprom)

# The modules other than the root require the root at a version not yet
# published; the go.work here replaces it with this directory. Use it
# whatever GOWORK the caller has set, except for the root module, which is
# vetted and tested with its own go.mod alone (GOWORK=off), as its users
# build it: the workspace would lend it the other modules' requirements.
workspace=$PWD/go.work
gowork() { if [ "$1" = . ]; then echo off; else echo "$workspace"; fi; }

# A -race binary sleeps 1 s before it exits (the race detector's
# atexit_sleep_ms), for goroutines still running to report a race: 1 s
# for each of the 26 runs of a test binary below, most of it on the cpu
# lane's one package after another. The tests have ended by then (and the
# testing package fails a test whose goroutines raced while it ran), so
# 100 ms is enough. A GORACE of the caller's comes after, and wins.
export GORACE="atexit_sleep_ms=100${GORACE:+ $GORACE}"

# phase TITLE: a step's heading, with the time taken so far.
phase() { echo "== $* (at ${SECONDS}s)"; }

phase "gofmt, go vet"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
for m in "${modules[@]}"; do
  [ -f "$m/go.mod" ] || continue
  (cd "$m" && GOWORK=$(gowork "$m") go vet ./...)
done

# Jobs in the background: bg NAME COMMAND... starts one, its output in a
# file; finish NAME [quiet] waits for it, shows the output (with quiet,
# only on a failure) and fails on a failure. A job still running when the
# script exits (a failed step, a signal) is ended with every process under
# it: killing the job's shell alone would leave its go test, test binary
# and redis-servers running (background jobs also ignore the terminal's
# Ctrl-C).
bg_dir=$(mktemp -d "${TMPDIR:-/tmp}/redlimit-test.XXXXXX")
declare -A bg_pid=()
# stop PID: ends a job, then what it had started (go test, test binaries)
# and theirs, which a background job's subshell would otherwise leave
# running; the parent first, so that it starts no new one.
stop() {
  local kids c
  kids=$(cat /proc/"$1"/task/*/children 2>/dev/null) || true
  kill "$1" 2>/dev/null || true
  for c in $kids; do stop "$c"; done
}
trap 'for p in "${bg_pid[@]}"; do stop "$p"; done; rm -rf "$bg_dir"' EXIT
bg() {
  local name=$1
  shift
  "$@" >"$bg_dir/$name.log" 2>&1 &
  bg_pid[$name]=$!
}
finish() {
  local name=$1 status=0
  wait "${bg_pid[$name]}" || status=$?
  unset "bg_pid[$name]" # its PID may be reused now
  if [ "$status" -ne 0 ] || [ "${2:-}" != quiet ]; then cat "$bg_dir/$name.log"; fi
  [ "$status" -eq 0 ] || { echo "$name failed (exit $status)" >&2; return 1; }
}

# From here to the end, at the lowest priority (nice 19): the release
# check (it tags a snapshot of this tree, serves it from a file-based
# module proxy and checks that go install of cmd/redlimit and go get of
# grpclimit and the metric modules work), the micro-benchmarks, once each
# (to keep them working, not to judge speed), and the linter (.ci/lint.sh:
# golangci-lint as tools/go.mod pins it, with .golangci.yml, on every
# module). None depends on timing, and they are mostly builds that the
# docs' commands, each under a timeout, need more: minutes of CPU for the
# linter on a machine that has not built it yet, and for the release
# check after a change to the library (its -trimpath builds share no
# cache with the others'), which the tests used to wait for. They end on
# what the docs' commands and the tests leave idle (the alone lane mostly
# waits on servers: about 40 s of CPU in its 130 s), and are waited for
# at the end.
bg release nice -n 19 .ci/release-check.sh
bg benchmarks nice -n 19 env GOWORK=off go test -run '^$' -bench . -benchtime=1x ./...
bg lint nice -n 19 .ci/lint.sh

phase "docs and example commands (the release check, the micro-benchmarks and the linter run meanwhile, at nice 19)"
# Every command of the docs (README.md, CONTRIBUTING.md, docs/*.md) and of
# the examples' doc comments, as written
# (each example at least once); servers with -selftest. See the script.
.ci/doc-commands.sh

# The lanes of the root package's tests, from what each test calls
# (internal/testlane; CONTRIBUTING.md, "Test lanes"), never from their
# names: each line of the output is a lane and a -run pattern that matches
# its tests.
#  - alone: the tests that a busy machine would skew (testlane.MarkAlone:
#    servers killed, paused and cut, with bounds on what a fault adds to a
#    call; the idle limiters' CPU) and those on a Redis Cluster (six
#    processes). They run first, alone but for the heavy tests below and
#    the background jobs above (all at nice 19);
#  - servers: the other tests that start a redis-server (through
#    internal/redistest), which test.sh reruns on each engine of
#    REDLIMIT_ENGINES with the alone ones;
#  - heavy: the longest miniredis tests (testlane.MarkHeavy: exact clocks,
#    no short timeouts), which run all along at the lowest priority
#    (nice 19) on what the others leave of the 2 cores;
#  - cpu: the others (miniredis, or no Redis at all).
# Each run of the test binary is told its lane (REDLIMIT_TEST_LANE), so that
# a test that starts a server where the analysis did not expect one fails.
lanes=$(GOWORK=off go run ./internal/testlane/lanes .)
lane() { sed -n "s/^$1 //p" <<<"$lanes"; }
alone_tests=$(lane alone)
server_tests=$(lane servers)
heavy_tests=$(lane heavy)
real_tests="$alone_tests|$server_tests" # every test that starts a redis-server

# After the alone lane, the others run in two lanes at once, at normal
# priority, each one package at a time (-p 1), as go test -p 2 would run
# them but for the lanes:
#  - servers: the root package's servers lane, then every other package
#    whose test binary links internal/redistest (its tests start
#    redis-servers). They mostly wait on servers and timers;
#  - cpu: the root package's cpu lane, then every other package.
# One lane would run them one after the other and leave a core idle. The
# root package's test binary is built once and runs as a process per lane;
# as processes of their own, the miniredis tests, whose Lua states map and
# unmap memory, do not contend for one process's address space.
server_pkgs=() cpu_pkgs=() # "MODULE IMPORT-PATH"
for m in "${modules[@]}"; do
  [ -f "$m/go.mod" ] || continue
  # In variables first: a go list that fails inside <(...) would not fail
  # the script, and its packages' tests would silently not run.
  list=$(cd "$m" && GOWORK=$(gowork "$m") go list -f '{{.ImportPath}}' ./...)
  linked=$(cd "$m" && GOWORK=$(gowork "$m") go list -test -f '{{.ImportPath}}{{range .Deps}} {{.}}{{end}}' ./... |
    awk '$1 ~ /\.test$/ && / github\.com\/redlimit\/redlimit\/internal\/redistest( |$)/ { sub(/\.test$/, "", $1); print $1 }')
  while read -r path; do
    [ "$path" = github.com/redlimit/redlimit ] && continue # split by lane, above
    if grep -qxF "$path" <<<"$linked"; then
      server_pkgs+=("$m $path")
    else
      cpu_pkgs+=("$m $path")
    fi
  done <<<"$list"
done

# run_tests ENTRY...: go test, module by module, the packages named. Every
# module runs; it fails if one did.
run_tests() {
  local status=0 m e pkgs
  for m in "${modules[@]}"; do
    pkgs=()
    for e in "$@"; do [ "${e%% *}" = "$m" ] && pkgs+=("${e#* }"); done
    [ ${#pkgs[@]} -gt 0 ] || continue
    (cd "$m" && GOWORK=$(gowork "$m") go test -race -count=1 -p 1 -timeout 20m "${pkgs[@]}") || status=1
  done
  return "$status"
}

phase "tests: the root package's alone lane (its heavy lane at nice 19 meanwhile)"
GOWORK=off go test -race -c -o "$bg_dir/redlimit.test" .
# root_tests LANE ARGS...: the root package's test binary, told its lane.
root_tests() { REDLIMIT_TEST_LANE=$1 "$bg_dir/redlimit.test" -test.count=1 -test.timeout 20m "${@:2}"; }
bg heavy nice -n 19 env REDLIMIT_TEST_LANE=heavy "$bg_dir/redlimit.test" -test.count=1 -test.timeout 20m -test.run "$heavy_tests"
test_status=0
root_tests alone -test.run "$alone_tests" || test_status=1

phase "tests: two lanes at once (the cpu lane's output follows the servers lane's)"
cpu_lane() {
  local status=0
  echo "-- the root package's cpu lane"
  root_tests cpu -test.skip "$real_tests|$heavy_tests" || status=1
  run_tests "${cpu_pkgs[@]}" || status=1
  return "$status"
}
bg cpu cpu_lane
echo "-- the root package's servers lane"
root_tests servers -test.run "$server_tests" || test_status=1
run_tests "${server_pkgs[@]}" || test_status=1
phase "tests: the servers lane ended; the cpu lane"
finish cpu || test_status=1
phase "tests: the root package's heavy lane"
finish heavy || test_status=1
phase "release check"
finish release || test_status=1
phase "micro-benchmarks, once each"
finish benchmarks quiet || test_status=1
phase "lint"
finish lint || test_status=1
[ "$test_status" -eq 0 ] || { echo "tests, the release check, the micro-benchmarks or the linter failed" >&2; exit 1; }

if [ -n "${REDLIMIT_ENGINES:-}" ]; then
  # The same real-Redis tests once more with every limiter deciding with a
  # Redis Function (WithRedisFunctions, which a script-only run would leave
  # untested but for its own tests, which run on every engine below). Only
  # with REDLIMIT_ENGINES (CI): without it, each assertion runs once
  # (about 200 s saved), and functions_test.go tests the Functions.
  phase "the root package's real-Redis tests with Redis Functions"
  GOWORK=off REDLIMIT_TEST_FUNCTIONS=1 go test -race -count=1 -p 1 -timeout 20m -run "$real_tests" .

  # On each engine: the root package's real-Redis and cluster tests, and
  # internal/redistest, which checks that servers, restarts and clusters
  # work on the engine. Every engine runs, then the failures are listed.
  IFS=: read -ra engines <<<"$REDLIMIT_ENGINES"
  failed=()
  for server in "${engines[@]}"; do
    if ! version=$("$server" --version); then
      failed+=("$server (does not run)")
      continue
    fi
    phase "tests on ${version%% sha=*} ($server)"
    start=$SECONDS
    if GOWORK=off REDLIMIT_REDIS_SERVER=$server go test -race -count=1 -p 1 -timeout 20m -run "$real_tests" . &&
      GOWORK=off REDLIMIT_REDIS_SERVER=$server go test -race -count=1 -p 1 -timeout 20m ./internal/redistest/; then
      echo "-- ${version%% sha=*}: passed in $((SECONDS - start)) s"
    else
      failed+=("${version%% sha=*}")
    fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    printf 'tests failed on: %s\n' "${failed[@]}" >&2
    exit 1
  fi
fi
phase "done: every step passed"
