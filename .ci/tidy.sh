#!/usr/bin/env bash
# Runs "go mod tidy" in every module of the repository.
#
# go mod tidy ignores go.work, so in a module other than the root it would
# fetch github.com/redlimit/redlimit at the version the module requires,
# which exists only once that release is published. Each of those modules is
# therefore tidied with a temporary "replace" of the root by this directory,
# dropped again afterwards (a published go.mod must not keep one; the
# release check fails on it).
set -euo pipefail
cd "$(dirname "$0")/.."
mod=github.com/redlimit/redlimit
git ls-files -co --exclude-standard -- go.mod '*/go.mod' | while read -r f; do
  [ -f "$f" ] || continue
  d=$(dirname "$f")
  echo "-- $d"
  if [ "$d" = . ]; then
    GOWORK=off go mod tidy
    continue
  fi
  (
    cd "$d"
    go mod edit -replace="$mod=$(realpath --relative-to=. "$OLDPWD")"
    trap 'go mod edit -dropreplace="$mod"' EXIT
    GOWORK=off go mod tidy
  )
done
