#!/usr/bin/env bash
# Release check: would this tree work for users once tagged and published?
#
#   .ci/release-check.sh [VERSION]
#
# Versions. Every module of the repository (every go.mod in it, all of
# them used by go.work, but tools/go.mod, which pins the development tools
# and is neither released nor in go.work) is released together with one
# version VERSION: the tag VERSION for the root
# module and DIR/VERSION for the module in DIR (grpclimit/v0.1.0,
# cmd/redlimit/v0.1.0, ...), all on one commit. Each of the other modules'
# go.mod requires github.com/redlimit/redlimit at VERSION, the release being
# made, and has no replace directive (a go install PKG@VERSION refuses one).
# Until VERSION is tagged, go.work makes local builds use the local root:
# its "replace github.com/redlimit/redlimit VERSION => ./" gives the
# workspace the go.mod of that not yet published version. After tagging a
# release, bump VERSION in the go.mod files and in go.work in one commit.
#
# The check, with VERSION taken from the go.mod files unless given:
#  1. every go.mod has no replace directive, every module but the root
#     requires the root at VERSION, go.work uses every module and replaces
#     the root at VERSION with ./;
#  2. a snapshot of the working tree (tracked and untracked, not ignored
#     files, so uncommitted changes count) is committed in a temporary git
#     repository and tagged as above; every module's packages and tests
#     resolve from its own go.mod and go.sum (GOWORK=off, the root replaced
#     by the snapshot through -modfile): the workspace could hide a
#     requirement or go.sum line that the module lacks;
#  3. "go mod download" with GOPROXY=direct, pointed at that repository by a
#     git url.insteadOf, fetches every module at VERSION into a temporary
#     module cache, whose cache/download directory is a module proxy in the
#     layout proxy.golang.org serves (@v/list, .info, .mod, .zip), made by
#     the same go command code;
#  4. with that directory first in GOPROXY (file://), the user's module
#     cache next (read only) and the usual GOPROXY last, a new empty module cache, and
#     GONOSUMDB for our modules only (the checksum database cannot know
#     them):
#       go install github.com/redlimit/redlimit/cmd/redlimit@VERSION
#     and the installed binary runs "redlimit simulate" offline; and in a
#     new module,
#       go get github.com/redlimit/redlimit/grpclimit@VERSION
#     then a program importing grpclimit builds and runs; the same for
#     extra/redlimitotel and extra/redlimitprom (go get of each, a program
#     importing both).
#
# Builds use -trimpath so that the build cache serves them although the
# module cache is a new directory each time. Nothing is left behind: the
# temporary directory is removed on exit, the repository is only read.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
mod=github.com/redlimit/redlimit
start=$SECONDS

status=0
fail() {
  echo "release check: $*" >&2
  status=1
}

# step NAME CMD...: run CMD, keep its output in $out, show it only if CMD
# fails.
out=
step() {
  local name=$1 t=$SECONDS
  shift
  if ! out=$("$@" 2>&1); then
    echo "-- $name: FAILED ($((SECONDS - t))s)"
    printf '%s\n' "$out" | sed 's/^/   /' >&2
    fail "$name failed"
    return 1
  fi
  echo "-- $name ($((SECONDS - t))s)"
}

# requires FILE: the version at which go.mod FILE requires $mod.
requires() {
  go mod edit -print "$1" | awk -v m="$mod" '
    /^require \(/ { blk = 1; next }
    /^\)/         { blk = 0; next }
    /^require / && $2 == m { print $3 }
    blk && $1 == m { print $2 }'
}

# 1. go.mod and go.work.
mapfile -t dirs < <(git ls-files -co --exclude-standard -- go.mod '*/go.mod' |
  while read -r f; do [ -f "$f" ] && dirname "$f"; done | grep -v -e '/testdata/' -e '^tools$' | LC_ALL=C sort -u)
versions=()
for d in "${dirs[@]}"; do
  f=$d/go.mod
  if go mod edit -print "$f" | grep -q '^replace'; then
    fail "$f has a replace directive; go install $mod/...@VERSION refuses such a module (use go.work)"
  fi
  [ "$d" = . ] && continue
  v=$(requires "$f")
  if [ -z "$v" ]; then
    fail "$f does not require $mod"
  else
    versions+=("$v")
  fi
done
version=${1:-}
if [ -z "$version" ]; then
  mapfile -t distinct < <(printf '%s\n' "${versions[@]}" | LC_ALL=C sort -u)
  if [ "${#distinct[@]}" -ne 1 ]; then
    fail "the modules require $mod at different versions: ${distinct[*]}; give one to check"
    exit 1
  fi
  version=${distinct[0]}
fi
if ! [[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-rc\.[0-9]+)?$ ]]; then
  fail "$version is not a release version (vX.Y.Z or vX.Y.Z-rc.N)"
  exit 1
fi
for i in "${!dirs[@]}"; do
  d=${dirs[$i]}
  [ "$d" = . ] && continue
  v=$(requires "$d/go.mod")
  [ "$v" = "$version" ] || fail "$d/go.mod requires $mod ${v:-(nothing)}, want $version"
done
echo "== release check of $version: ${dirs[*]}"
if [ ! -f go.work ]; then
  fail "no go.work: local builds of the other modules would use the published $mod"
else
  used=$(go work edit -json go.work | awk -F'"' '$2 == "DiskPath" { p = $4; sub(/^\.\//, "", p); if (p == "") p = "."; print p }' | LC_ALL=C sort)
  want=$(printf '%s\n' "${dirs[@]}" | LC_ALL=C sort)
  [ "$used" = "$want" ] || fail "go.work uses $(tr '\n' ' ' <<<"$used"), want every module: $(tr '\n' ' ' <<<"$want")"
  if ! go work edit -print go.work | grep -Eq "^(replace)?[[:space:]]*$mod $version => \./?\$"; then
    fail "go.work does not replace $mod $version => ./ (workspace builds would fetch $mod@$version)"
  fi
fi

# 2. A tagged snapshot of the working tree.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/redlimit-release.XXXXXX")
cleanup() {
  chmod -R u+w "$tmp" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir "$tmp/repo"
git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$tmp/repo"

# Our git configuration only, whatever the user's says (signing, url rewrites).
printf '[url "file://%s/repo"]\n\tinsteadOf = https://%s\n' "$tmp" "$mod" >"$tmp/gitconfig"
export GIT_CONFIG_GLOBAL="$tmp/gitconfig" GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0
export GIT_AUTHOR_NAME=release-check GIT_AUTHOR_EMAIL=release-check@localhost
export GIT_COMMITTER_NAME=release-check GIT_COMMITTER_EMAIL=release-check@localhost
tags=()
paths=()
for d in "${dirs[@]}"; do
  if [ "$d" = . ]; then
    tags+=("$version")
    paths+=("$mod")
  else
    tags+=("$d/$version")
    paths+=("$mod/$d")
  fi
done
(
  cd "$tmp/repo"
  git init -q -b main
  git add -A
  git commit -q -m "snapshot for the release check"
  for t in "${tags[@]}"; do git tag "$t"; done
)
echo "-- tagged a snapshot of the working tree: ${tags[*]} ($((SECONDS - start))s since the start)"

# Each module resolves its packages and tests from its own go.mod and
# go.sum (GOWORK=off): the workspace would lend it a requirement or a go.sum
# line that only another module has. The root and the other modules of the
# repository (examples/prometheus requires extra/redlimitprom) are the
# snapshot, through replaces in a copy of the go.mod given with -modfile;
# the user's module cache serves the rest.
mkdir "$tmp/modfile"
for d in "${dirs[@]}"; do
  flags=()
  if [ "$d" != . ]; then
    f=$tmp/modfile/${d//\//_}
    cp "$tmp/repo/$d/go.mod" "$f.mod"
    cp "$tmp/repo/$d/go.sum" "$f.sum" 2>/dev/null || : >"$f.sum"
    for i in "${!dirs[@]}"; do
      [ "${dirs[$i]}" = "$d" ] || go mod edit -replace="${paths[$i]}=$tmp/repo/${dirs[$i]}" "$f.mod"
    done
    flags=(-modfile="$f.mod")
  fi
  GOWORK=off step "$d: go list -deps -test ./... (own go.mod, GOWORK=off)" \
    go list -C "$tmp/repo/$d" "${flags[@]}" -deps -test ./... || true
done

# 3. The module proxy: a module cache's cache/download directory.
userproxy=$(go env GOPROXY)
usercache=$(go env GOMODCACHE)
export GOWORK=off GOFLAGS="-modcacherw -trimpath" GOPRIVATE='' GONOPROXY='' GOINSECURE=''
export GONOSUMDB=$mod
queries=()
for p in "${paths[@]}"; do queries+=("$p@$version"); done
step "go mod download ${queries[*]} (GOPROXY=direct, from the snapshot)" \
  env GOMODCACHE="$tmp/proxy" GOPROXY=direct go mod download "${queries[@]}" ||
  { echo "release check FAILED after $((SECONDS - start))s" >&2; exit 1; }

# 4. What users do.
export GOMODCACHE="$tmp/modcache" GOBIN="$tmp/bin"
export GOPROXY="file://$tmp/proxy/cache/download,file://$usercache/cache/download,$userproxy"
mkdir "$tmp/use" "$tmp/modcache" "$tmp/bin"

cd "$tmp"
if step "go install $mod/cmd/redlimit@$version" go install "$mod/cmd/redlimit@$version" &&
  step "redlimit simulate (the installed binary)" \
    "$tmp/bin/redlimit" simulate -pattern bursty -rate 10 -period 1s -duration 2s -out "$tmp/simulate.png"; then
  grep -q token-bucket <<<"$out" || fail "redlimit simulate printed no token-bucket row: $out"
fi

cd "$tmp/use"
cat >main.go <<'EOF'
// A user of grpclimit: it builds against the published modules only.
package main

import (
	"fmt"

	"github.com/redlimit/redlimit/grpclimit"
)

func main() {
	fmt.Printf("%T\n", grpclimit.UnaryServerInterceptor)
}
EOF
step "go mod init example.com/use" go mod init example.com/use &&
  step "go get $mod/grpclimit@$version (in a new module)" go get "$mod/grpclimit@$version" &&
  step "go build (a program importing grpclimit)" go build -o use . &&
  step "run it" ./use || true

# The metric modules, in another new module.
mkdir "$tmp/metrics"
cd "$tmp/metrics"
cat >main.go <<'EOF'
// A user of the metric modules: it builds against the published modules only.
package main

import (
	"fmt"

	"github.com/redlimit/redlimit/extra/redlimitotel"
	"github.com/redlimit/redlimit/extra/redlimitprom"
)

func main() {
	m, err := redlimitotel.New()
	if err != nil {
		panic(err)
	}
	fmt.Println(len(m.Options("api")), len(redlimitprom.NewCollector().Options("api")))
}
EOF
if step "go mod init example.com/metrics" go mod init example.com/metrics &&
  step "go get $mod/extra/redlimitotel@$version (in a new module)" go get "$mod/extra/redlimitotel@$version" &&
  step "go get $mod/extra/redlimitprom@$version" go get "$mod/extra/redlimitprom@$version" &&
  step "go build (a program importing both)" go build -o metrics . &&
  step "run it" ./metrics; then
  [ "$out" = "2 2" ] || fail "the metrics program printed $out, want 2 2"
fi

cd "$repo"
t=$SECONDS
cleanup
trap - EXIT
echo "-- removed the temporary directory ($((SECONDS - t))s)"
if [ "$status" -ne 0 ]; then
  echo "release check FAILED after $((SECONDS - start))s" >&2
  exit 1
fi
echo "release check passed in $((SECONDS - start))s"
