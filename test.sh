#!/usr/bin/env bash
# The one test command (see CONTRIBUTING.md). It runs every module's tests with
# -race, every command of the docs and of the examples' doc comments, the
# release check, and the micro-benchmarks once each (to keep them working,
# not to judge speed). Tests that need redis-server start their own on free
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
# The release check runs in the background while the docs' commands run
# (it builds and copies; no timing depends on it), its output shown when
# it ends; the root package's tests run after both, alone.
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

echo "== gofmt, go vet"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
for m in "${modules[@]}"; do
  [ -f "$m/go.mod" ] || continue
  (cd "$m" && GOWORK=$(gowork "$m") go vet ./...)
done

# The release check, in the background: it tags a snapshot of this tree,
# serves it from a file-based module proxy and checks that go install of
# cmd/redlimit and go get of grpclimit work. Its output goes to a file,
# shown (and its exit status checked) after the docs' commands.
release_log=$(mktemp "${TMPDIR:-/tmp}/redlimit-release-check.XXXXXX")
.ci/release-check.sh >"$release_log" 2>&1 &
release_pid=$!
trap 'kill "$release_pid" 2>/dev/null || true; rm -f "$release_log"' EXIT

echo "== docs and example commands (the release check runs meanwhile)"
# Every command of the docs (README.md, CONTRIBUTING.md, docs/*.md) and of
# the examples' doc comments, as written
# (each example at least once); servers with -selftest. See the script.
.ci/doc-commands.sh

echo "== release check"
release_status=0
wait "$release_pid" || release_status=$?
trap - EXIT # its PID may be reused now
cat "$release_log"
rm -f "$release_log"
[ "$release_status" -eq 0 ] || { echo "release check failed (exit $release_status)" >&2; exit 1; }

echo "== micro-benchmarks, once each"
bench_out=$(GOWORK=off go test -run '^$' -bench . -benchtime=1x ./... 2>&1) || { echo "$bench_out" >&2; exit 1; }

# The root package's tests that start a redis-server (standalone or a
# cluster), which test.sh reruns on each engine of REDLIMIT_ENGINES; the
# others run on miniredis and would only repeat themselves (about 3 of the
# 5 minutes the package takes). The names say which they are;
# TestEngineTestsNamed (redis_test.go) checks that every test that starts a
# server matches.
engine_tests='Redis$|Cluster$|^TestFault|^TestCluster|^TestAutoPipeliner$|^TestConcurrencyLimitHolderKilled$|^TestConcurrencyLimitMemory$|^TestScope|^TestCrashEachClient$|^TestProbeBackoff$|^TestTransitionsOrdered$|^TestClosedClient|^TestCheckClientNoNetwork$|^TestNilArguments$|^TestEngineParity$|^TestRetriedScriptCounts$|^TestPrefetchHangNoQueue$'

echo "== tests"
for m in "${modules[@]}"; do
  [ -f "$m/go.mod" ] || continue
  # -p 1: one package at a time, so that the timing-sensitive fault and
  # cluster tests do not share the 2 cores with another package's clusters.
  (cd "$m" && GOWORK=$(gowork "$m") go test -race -count=1 -p 1 -timeout 20m ./...)
done

if [ -n "${REDLIMIT_ENGINES:-}" ]; then
  # The same real-Redis tests once more with every limiter deciding with a
  # Redis Function (WithRedisFunctions, which a script-only run would leave
  # untested but for its own tests, which run on every engine below). Only
  # with REDLIMIT_ENGINES (CI): without it, each assertion runs once
  # (about 200 s saved), and functions_test.go tests the Functions.
  echo "== the root package's real-Redis tests with Redis Functions"
  GOWORK=off REDLIMIT_TEST_FUNCTIONS=1 go test -race -count=1 -p 1 -timeout 20m -run "$engine_tests" .

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
    echo "== tests on ${version%% sha=*} ($server)"
    start=$SECONDS
    if GOWORK=off REDLIMIT_REDIS_SERVER=$server go test -race -count=1 -p 1 -timeout 20m -run "$engine_tests" . &&
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
