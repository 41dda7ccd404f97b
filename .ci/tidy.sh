#!/usr/bin/env bash
# Runs "go mod tidy" in every module of the repository.
#
# go mod tidy ignores go.work, so in a module other than the root it would
# fetch github.com/redlimit/redlimit (or another module of this repository,
# such as extra/redlimitprom, which examples/prometheus requires) at the
# version the module requires, which exists only once that release is
# published. Each of those modules is therefore tidied with a temporary
# "replace" of every module of the repository by its directory here,
# dropped again afterwards (a published go.mod must not keep one; the
# release check fails on it). The tools module (tools/, the development
# tools' pins) requires none of them: tidied as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=github.com/redlimit/redlimit
mapfile -t dirs < <(git ls-files -co --exclude-standard -- go.mod '*/go.mod' |
  while read -r f; do [ -f "$f" ] && dirname "$f"; done | grep -v -e '/testdata/' -e '^tools$')
for d in . tools; do
  [ -f "$d/go.mod" ] || continue
  echo "-- $d"
  (cd "$d" && GOWORK=off go mod tidy)
done
for d in "${dirs[@]}"; do
  [ "$d" = . ] && continue
  echo "-- $d"
  (
    cd "$d"
    replace=() drop=()
    for o in "${dirs[@]}"; do
      [ "$o" = "$d" ] && continue
      p=$mod
      [ "$o" = . ] || p=$mod/$o
      replace+=(-replace="$p=$(realpath --relative-to=. "$OLDPWD/$o")")
      drop+=(-dropreplace="$p")
    done
    go mod edit "${replace[@]}"
    trap 'go mod edit "${drop[@]}"' EXIT
    GOWORK=off go mod tidy
  )
done
