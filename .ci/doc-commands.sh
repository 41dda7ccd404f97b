#!/usr/bin/env bash
# Runs every command of the docs (README.md, CONTRIBUTING.md, docs/*.md)
# and of the examples' doc comments as written, so that none of them rots.
#
#   .ci/doc-commands.sh       run them (test.sh does)
#   .ci/doc-commands.sh -l    list them and how each would run
#   .ci/doc-commands.sh -v    run them and show the output of each
#
# Which lines are commands:
#  - README.md, CONTRIBUTING.md and docs/*.md: every line of a fenced
#    block labelled sh (```sh), except
#    blank and # lines; and every inline code span that starts with "go ",
#    "cd " or "./". A fenced block must be labelled (sh, text, go, ...), and
#    bash, shell and console are refused (use sh), so that no command hides
#    in a block the check skips.
#  - examples/*/main.go: every indented line of the doc comment above
#    "package main" that starts with "go ", "cd " or "./".
# Commands that are not run are listed in $skip below with the reason; an
# entry that matches no command is an error.
#
# How they run: each from the root of a copy of the working tree (so that a
# command that writes files, such as the simulate chart, changes nothing
# here; removed afterwards), with "bash -c", a trailing "# comment" dropped, a 120 s timeout,
# GOWORK unset (the go.work at the root applies, as for a user), and a
# flushed Redis. A command that starts a server that would serve forever
# (go run of a package with a -selftest flag, without -selftest) runs with
# -selftest appended: it serves, sends itself requests, and exits.
#
# Where: in a private network namespace (unshare), where localhost:6379 is a
# redis-server and 127.0.0.1:7000, 127.0.0.1:7001, 127.0.0.1:7002 a 3-master
# Redis Cluster started for the check (loopback only, in the namespace), so that commands written for "a Redis
# on localhost" run as written without touching a Redis of the machine.
# Without unshare, ip or redis-server, commands that name a Redis (-redis,
# -addrs) are skipped with a message, or fail with REDLIMIT_REQUIRE_REDIS=1,
# and the others run in the machine's network.
set -euo pipefail
cd "$(dirname "$0")/.."
self=$PWD/.ci/doc-commands.sh
cmd_timeout=120

# The commands not run, with the reason.
declare -A skip=(
  ['./test.sh']='the command that runs this check (CI runs it: .ci/run)'
  ['go test -race -count=1 ./...']='names a step of ./test.sh, which runs it in every module'
  ['go vet']='names a step of ./test.sh, which runs it in every module'
  ['go run']='a verb in a sentence'
  ['go get github.com/redlimit/redlimit']='run in a user'"'"'s module, not in this repository'
  ['cd bench && go run ./cmd/regions -spread 10ms -seeds 100 -strategy fw -limit 3000 -period 1m']='the program of the command above it in docs/regions-simulation.md, with other flags (each go run links it again, about 5 s)'
  ['cd bench && go run ./cmd/regions -seeds 100']='the program of the command above it in docs/regions-simulation.md, with other flags (each go run links it again, about 5 s)'
  ['cd bench && go run ./cmd/regions -measure']='30-50 s against redis-servers it starts: rerun by hand for the costs in docs/regions-simulation.md'
  ['cd bench && go run ./cmd/regions -regions 10 -instances 100 -keys 10000 -all-keys 1000000 -sync 200ms -rtt 100ms -rate 0.001 -limit 0.5 -burst 5 -run 60s -seeds 1']='a simulation at internet scale, 8-50 s each: rerun by hand (docs/regions-simulation.md)'
  ['cd bench && go run ./cmd/regions -regions 10 -instances 100 -keys 10000 -all-keys 1000000 -sync 200ms -rtt 100ms -rate 0.01 -limit 5 -burst 5 -pre 10s -run 30s -cut 20s -seeds 1']='a simulation at internet scale, 8-50 s each: rerun by hand (docs/regions-simulation.md)'
  ['cd bench && go run ./cmd/regions -regions 10 -instances 100 -keys 10000 -all-keys 1000000 -sync 200ms -rtt 100ms -rate 0.01 -limit 5 -burst 5 -run 60s -seeds 1']='a simulation at internet scale, 8-50 s each: rerun by hand (docs/regions-simulation.md)'
  ['cd bench && go run ./cmd/regions -regions 10 -instances 100 -keys 10000 -all-keys 1000000 -sync 200ms -rtt 100ms -rate 0.01 -strategy fw -limit 300 -period 1m -run 60s -seeds 1']='a simulation at internet scale, 8-50 s each: rerun by hand (docs/regions-simulation.md)'
)

# ---- Inside the network namespace: .ci/doc-commands.sh --sandbox DIR ----
if [ "${1:-}" = --sandbox ]; then
  tmp=$2
  pids=()
  stop() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  }
  trap stop EXIT
  ip link set lo up
  nodes=(7000 7001 7002) # ports on 127.0.0.1
  # server NAME PORT BIND ARGS...: a redis-server in $tmp/redis/NAME.
  server() {
    local name=$1 port=$2 bind=$3
    shift 3
    mkdir -p "$tmp/redis/$name"
    redis-server --port "$port" --bind "$bind" --save '' --appendonly no \
      --dir "$tmp/redis/$name" --logfile "$tmp/redis/$name/log" "$@" &
    pids+=($!)
  }
  server standalone 6379 '127.0.0.1 -::1'
  for n in "${nodes[@]}"; do
    server "$n" "$n" 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file nodes.conf --cluster-node-timeout 2000
  done
  for i in $(seq 100); do
    up=1
    redis-cli -p 6379 ping >/dev/null 2>&1 || up=0
    for n in "${nodes[@]}"; do redis-cli -p "$n" ping >/dev/null 2>&1 || up=0; done
    [ "$up" = 1 ] && break
    sleep 0.1
  done
  timeout 60 redis-cli --cluster create "${nodes[@]/#/127.0.0.1:}" --cluster-yes >"$tmp/redis/create.log" 2>&1 ||
    { cat "$tmp/redis/create.log" >&2; exit 1; }
  for i in $(seq 100); do
    ok=1
    for n in "${nodes[@]}"; do
      redis-cli -p "$n" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || ok=0
    done
    [ "$ok" = 1 ] && break
    [ "$i" = 100 ] && { echo "the test cluster never reached cluster_state:ok" >&2; exit 1; }
    sleep 0.1
  done
  export DOC_FLUSH="redis-cli -p 6379 flushall >/dev/null; for n in ${nodes[*]}; do redis-cli -p \$n flushall >/dev/null; done"
  # No network here: the go command must not try to download anything.
  export GOPROXY=off
  bash "$self" --run "$tmp"
  exit
fi

# ---- Running the plan: .ci/doc-commands.sh --run DIR ----
# $DIR/plan has one command a line: "run<TAB>display<TAB>where".
if [ "${1:-}" = --run ]; then
  tmp=$2
  status=0
  cd "$tmp/repo"
  while IFS=$'\t' read -r run display where; do
    if [ -n "${DOC_FLUSH:-}" ] && ! bash -c "$DOC_FLUSH"; then
      echo "cannot flush the test Redis (see $tmp/redis/*/log)" >&2
      exit 1
    fi
    t=$SECONDS
    if timeout -k 5 "$cmd_timeout" bash -c "$run" </dev/null >"$tmp/out" 2>&1; then
      printf 'ok   %3ds  %s\n' $((SECONDS - t)) "$display"
      [ "${DOC_VERBOSE:-}" = 1 ] && sed 's/^/     | /' "$tmp/out"
    else
      rc=$?
      printf 'FAIL %3ds  %s  (exit %d%s; %s)\n' $((SECONDS - t)) "$display" "$rc" \
        "$([ "$rc" = 124 ] && echo ", timed out after ${cmd_timeout}s")" "$where"
      tail -n 40 "$tmp/out" | sed 's/^/     | /'
      status=1
    fi
  done <"$tmp/plan"
  exit "$status"
fi

# ---- Extracting and planning ----
list_only=0
case ${1:-} in
-l) list_only=1 ;;
-v) export DOC_VERBOSE=1 ;;
'') ;;
*) echo "usage: .ci/doc-commands.sh [-l | -v]" >&2; exit 2 ;;
esac

# Prints "FILE:LINE<TAB>COMMAND" for every command, and "!<TAB>MESSAGE" for
# a fenced block the check cannot classify.
extract() {
  awk '
    function emit(cmd) { print FILENAME ":" FNR "\t" cmd }
    FNR == 1 { fence = 0 }
    FILENAME ~ /\.md$/ {
      if ($0 ~ /^[ \t]*```/) {
        if (!fence) {
          fence = 1
          info = $0
          sub(/^[ \t]*```+[ \t]*/, "", info)
          sub(/[ \t].*$/, "", info)
          if (info == "") print "!\t" FILENAME ":" FNR ": label this fenced block (sh for commands, text, go, ...)"
          if (info ~ /^(bash|shell|console|sh-session|shell-session|zsh)$/) print "!\t" FILENAME ":" FNR ": label commands sh, not " info
        } else fence = 0
        next
      }
      if (fence) {
        if (info == "sh" && $0 !~ /^[ \t]*(#.*)?$/) emit($0)
        next
      }
      line = $0
      while (match(line, /`[^`]+`/)) {
        span = substr(line, RSTART + 1, RLENGTH - 2)
        if (span ~ /^(go |cd |\.\/)/) emit(span)
        line = substr(line, RSTART + RLENGTH)
      }
      next
    }
    FNR == 1 { doc = 1 }
    /^package / { doc = 0 }
    doc && /^\/\/\t/ {
      cmd = substr($0, 4)
      if (cmd ~ /^(go |cd |\.\/)/) emit(cmd)
    }
  ' README.md CONTRIBUTING.md docs/*.md examples/*/main.go
}

mapfile -t records < <(extract)
bad=0
declare -A where=() used=()
order=()
for r in "${records[@]}"; do
  loc=${r%%$'\t'*}
  cmd=${r#*$'\t'}
  if [ "$loc" = '!' ]; then
    echo "$cmd" >&2
    bad=1
    continue
  fi
  # A trailing shell comment changes nothing; drop it, and the spaces.
  cmd=$(sed -E 's/[[:space:]]+#.*$//; s/[[:space:]]+$//; s/^[[:space:]]+//' <<<"$cmd")
  if [ -z "${where[$cmd]+x}" ]; then
    order+=("$cmd")
    where[$cmd]=$loc
  else
    where[$cmd]+=", $loc"
  fi
done

sandbox=1
why_no_sandbox=
if ! command -v unshare >/dev/null || ! command -v ip >/dev/null; then
  sandbox=0 why_no_sandbox="unshare or ip (iproute2) is not installed"
elif ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  sandbox=0 why_no_sandbox="redis-server is not installed"
else
  unshare_flags=(--net)
  [ "$(id -u)" = 0 ] || unshare_flags=(--map-root-user --net)
  if ! unshare "${unshare_flags[@]}" true 2>/dev/null; then
    sandbox=0 why_no_sandbox="unshare ${unshare_flags[*]} is not permitted here"
  fi
fi

# The copy has the same path at every run from this directory, so that the
# build cache (whose keys include the source directory) serves the go run
# builds of the last run; a lock on this script keeps concurrent runs apart.
exec 9<"$self"
flock 9
tmp=${TMPDIR:-/tmp}/redlimit-doc-$(printf %s "$PWD" | cksum | cut -d' ' -f1)
rm -rf "$tmp"
mkdir "$tmp"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
: >"$tmp/plan"
declare -A ran_dir=() planned=()
plan=() pkgs=()
for cmd in "${order[@]}"; do
  loc=${where[$cmd]}
  if [ -n "${skip[$cmd]+x}" ]; then
    used[$cmd]=1
    printf 'skip       %s  (%s; %s)\n' "$cmd" "${skip[$cmd]}" "$loc"
    continue
  fi
  run=$cmd display=$cmd
  # The directory of the package a "go run" builds, from the root.
  dir=
  if [[ $cmd =~ ^(cd[[:space:]]+([^[:space:]&;]+)[[:space:]]*\&\&[[:space:]]*)?go[[:space:]]+run[[:space:]]+([^[:space:]]+) ]]; then
    dir=${BASH_REMATCH[2]:-.}/${BASH_REMATCH[3]}
    dir=$(cd "$dir" 2>/dev/null && pwd -P || true)
    if [ "$dir" = "$(pwd -P)" ]; then
      dir=.
    else
      dir=${dir#"$(pwd -P)"/}
    fi
  fi
  if [ -n "$dir" ] && [[ $cmd != *-selftest* ]] && grep -qs 'flag.Bool("selftest"' "$dir"/*.go; then
    run="$cmd -selftest"
    display="$run  (serves forever as written: -selftest added)"
  fi
  if [[ " $cmd " =~ [[:space:]]-(-)?(redis|addrs)[[:space:]=] ]] && [ "$sandbox" = 0 ]; then
    if [ "${REDLIMIT_REQUIRE_REDIS:-}" = 1 ]; then
      echo "cannot run \"$cmd\" ($loc): $why_no_sandbox, and REDLIMIT_REQUIRE_REDIS=1" >&2
      bad=1
    else
      printf 'skip       %s  (%s; %s)\n' "$cmd" "needs the test Redis, but $why_no_sandbox" "$loc"
    fi
    continue
  fi
  [[ $dir == examples/* ]] && ran_dir[${dir%%/*}/$(cut -d/ -f2 <<<"$dir")]=1
  [ -n "$dir" ] && pkgs+=("./$dir")
  # Two commands can be one once -selftest is added: run it once.
  if [ -n "${planned[$run]+x}" ]; then
    planned[$run]+=", $loc"
  else
    planned[$run]=$loc
    plan+=("$run"$'\t'"$display")
  fi
done
for p in "${plan[@]}"; do
  printf '%s\t%s\n' "$p" "${planned[${p%%$'\t'*}]}" >>"$tmp/plan"
done
for s in "${!skip[@]}"; do
  [ -n "${used[$s]+x}" ] || { echo "the skip list names \"$s\", which is no command in the docs: remove it" >&2; bad=1; }
done
for d in examples/*/; do
  d=${d%/}
  [ -n "${ran_dir[$d]+x}" ] || { echo "$d: no command in its doc comment or the docs runs it" >&2; bad=1; }
done
if [ "$list_only" = 1 ]; then
  cut -f2,3 "$tmp/plan" | sed 's/\t/   (/; s/$/)/; s/^/run        /'
  exit "$bad"
fi
[ "$bad" = 0 ] || exit 1

# A copy of the working tree: tracked files and untracked ones not ignored.
mkdir "$tmp/repo"
git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$tmp/repo"
unset GOWORK

if [ "$sandbox" = 1 ]; then
  # Download what the commands build first: the namespace has no network.
  # A package that does not build is reported by its command below.
  if [ "${#pkgs[@]}" -gt 0 ] && ! (cd "$tmp/repo" && go list -e -deps "${pkgs[@]}" >/dev/null); then
    echo "-- go list -deps ${pkgs[*]} failed; the commands run anyway" >&2
  fi
  echo "-- in a network namespace: Redis at localhost:6379, a Redis Cluster at 127.0.0.1:7000-7002"
  unshare "${unshare_flags[@]}" bash "$self" --sandbox "$tmp"
else
  echo "-- without a sandbox ($why_no_sandbox)"
  bash "$self" --run "$tmp"
fi
