#!/usr/bin/env bash
# Runs golangci-lint, at the version tools/go.mod pins and with the
# configuration in .golangci.yml, on every module of the repository (every
# go.mod but the tools module's), as ./test.sh does:
#
#   .ci/lint.sh            lint every module
#   .ci/lint.sh DIR...     lint the modules in DIR... (., grpclimit, ...)
#
# The root module is linted with its own go.mod alone (GOWORK=off), as it
# is vetted and tested; the others through the root's go.work, in one run
# (their packages share most dependencies, loaded once).
#
# The binary is built once from tools/go.mod (several minutes on 2 cores)
# and kept in ${XDG_CACHE_HOME:-~/.cache}/redlimit-tools under a name made
# from tools/go.mod, tools/go.sum and the Go version, so that a new pin or
# a new Go builds a new one; golangci-lint keeps its own cache of results
# (GOLANGCI_LINT_CACHE, by default in the same cache directory), which
# makes a run with little changed take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

key=$({ cat tools/go.mod tools/go.sum; go env GOVERSION; } | sha256sum | cut -c1-16)
dir=${XDG_CACHE_HOME:-$HOME/.cache}/redlimit-tools
bin=$dir/golangci-lint-$key
if [ ! -x "$bin" ]; then
  echo "-- building golangci-lint from tools/go.mod into $bin"
  mkdir -p "$dir"
  # The tools module is not in go.work (its dependencies are no other
  # module's business): GOWORK=off. Built beside its final name, then
  # renamed, so that a run interrupted or running at the same time never
  # finds half a binary.
  (cd tools && GOWORK=off go build -o "$bin.$$" github.com/golangci/golangci-lint/v2/cmd/golangci-lint)
  mv "$bin.$$" "$bin"
fi

if [ $# -gt 0 ]; then
  dirs=("$@")
else
  mapfile -t dirs < <(git ls-files -co --exclude-standard -- go.mod '*/go.mod' |
    while read -r f; do [ -f "$f" ] && dirname "$f"; done |
    grep -v -e '/testdata/' -e '^tools$' | LC_ALL=C sort -u)
fi

status=0
others=()
for d in "${dirs[@]}"; do
  d=${d%/}
  if [ "$d" = . ]; then
    echo "-- golangci-lint: . (GOWORK=off)"
    GOWORK=off "$bin" run ./... || status=1
  else
    others+=("./$d/...")
  fi
done
if [ ${#others[@]} -gt 0 ]; then
  echo "-- golangci-lint: ${others[*]} (go.work)"
  GOWORK=$PWD/go.work "$bin" run "${others[@]}" || status=1
fi
exit "$status"
