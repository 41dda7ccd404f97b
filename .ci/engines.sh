#!/usr/bin/env bash
# Fetches the extra server engines the tests run on, from Debian's package
# archive, and writes for each one a redis-server (and redis-cli) wrapper that
# the test harness can run by path (REDLIMIT_REDIS_SERVER=<wrapper>):
#
#   redis-6.0   bullseye's redis-server, run by this machine's loader with
#               bullseye's libssl1.1, Lua 5.1, lua-cjson, lua-bitop, jemalloc
#   redis-8.0   trixie's redis-server    } run by trixie's own loader with
#   valkey-8.1  trixie's valkey-server   } trixie's glibc 2.41 and libraries
#
# Nothing is installed: the packages are unpacked with dpkg-deb -x into the
# cache directory ${REDLIMIT_ENGINES_DIR:-$HOME/.cache/redlimit-engines}.
# apt runs with a private configuration, source list, lists and cache in that
# directory (APT_CONFIG), so the system's apt state and apt.conf.d hooks are
# left alone. The mirror is the one in /etc/apt/sources.list*.
#
# Idempotent: an engine already unpacked is only checked again. Each engine is
# checked by starting it on a unix socket (no TCP port) and asking PING and an
# EVAL with its redis-cli. It prints each engine's --version and exits 1 if an
# engine cannot be set up or does not run.
#
#   .ci/engines.sh          fetch, check and print the engines
#   .ci/engines.sh --paths  print the ready wrappers, colon-separated (for
#                           REDLIMIT_ENGINES, read by test.sh); fetch nothing
set -euo pipefail

dir=${REDLIMIT_ENGINES_DIR:-${HOME:-/tmp}/.cache/redlimit-engines}
# The engines, in the order test.sh runs them.
engines=(redis-6.0 redis-8.0 valkey-8.1)

if [ "${1:-}" = --paths ]; then
  paths=()
  for e in "${engines[@]}"; do
    [ -f "$dir/$e/ok" ] && paths+=("$dir/$e/bin/redis-server")
  done
  (IFS=:; echo "${paths[*]}")
  exit 0
fi

# Per engine: the Debian suite, the server and client programs inside the
# packages, and the packages. Bullseye's binaries need glibc >= 2.29 and run on
# the system's (bookworm) glibc and libsystemd; trixie's need glibc 2.38, so
# they bring trixie's whole library set, libc6 included, and its loader.
suite() {
  case $1 in
    redis-6.0) echo bullseye ;;
    *) echo trixie ;;
  esac
}
programs() {
  case $1 in
    valkey-*) echo valkey-server valkey-cli ;;
    *) echo redis-server redis-cli ;;
  esac
}
packages() {
  local trixie_libs="libc6 libssl3t64 libsystemd0 liblzf1 libjemalloc2 libatomic1 libstdc++6 libgcc-s1 libcap2 zlib1g libzstd1"
  case $1 in
    redis-6.0) echo redis-server redis-tools liblua5.1-0 lua-cjson lua-bitop libssl1.1 libjemalloc2 liblzf1 libatomic1 ;;
    redis-8.0) echo redis-server redis-tools "$trixie_libs" ;;
    valkey-8.1) echo valkey-server valkey-tools "$trixie_libs" ;;
  esac
}

# mirror debian|debian-security: the machine's mirror for that archive, from
# its apt sources (one-line or deb822 format).
mirror() {
  local m
  m=$({
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^[[:space:]]*URIs:[[:space:]]*//p' | tr ' ' '\n'
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      sed -E -n 's/\[[^]]*\]//; s/^[[:space:]]*deb[[:space:]]+([^[:space:]]+).*/\1/p'
  } | sed 's:/*$::' | grep -E "/$1\$" | head -n 1) || true
  echo "${m:-http://deb.debian.org/$1}"
}

# apt_for SUITE: writes a private apt configuration for SUITE (with its
# -updates and -security suites) and runs apt-get update once per run of this
# script. It sets conf to the APT_CONFIG path.
declare -A updated=()
apt_for() {
  local s=$1 a="$dir/apt/$1"
  mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$a/parts" "$a/preferences.d"
  local key=/usr/share/keyrings/debian-archive-keyring.gpg main sec
  main=$(mirror debian)
  sec=$(mirror debian-security)
  cat >"$a/sources.list" <<EOF
deb [signed-by=$key] $main $s main
deb [signed-by=$key] $main $s-updates main
deb [signed-by=$key] $sec $s-security main
EOF
  # Dir::Etc::Parts and Main point away from /etc/apt, so no hook of the
  # system's apt.conf.d runs; the options it sets that matter are repeated.
  cat >"$a/apt.conf" <<EOF
Dir::Etc::Main "/dev/null";
Dir::Etc::Parts "$a/parts";
Dir::Etc::SourceList "$a/sources.list";
Dir::Etc::SourceParts "/dev/null";
Dir::Etc::Preferences "/dev/null";
Dir::Etc::PreferencesParts "$a/preferences.d";
Dir::State "$a";
Dir::State::Lists "$a/lists";
Dir::State::status "/dev/null";
Dir::Cache "$a/cache";
APT::Sandbox::User "root";
Acquire::Languages "none";
Acquire::Check-Valid-Until "false";
Acquire::Check-Date "false";
EOF
  conf="$a/apt.conf"
  if [ -z "${updated[$s]:-}" ]; then
    APT_CONFIG="$conf" apt-get -qq update
    updated[$s]=1
  fi
}

# loader ENGINE ROOT: the dynamic loader that runs the engine's binaries.
loader() {
  case $(suite "$1") in
    bullseye) echo /lib64/ld-linux-x86-64.so.2 ;;
    *) echo "$2/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" ;;
  esac
}

# wrapper FILE LOADER_LINK LIBS BINARY: an executable that execs BINARY
# through the loader, so the test harness's child process is the server
# itself (same PID, signals reach it). The loader is called through a
# symlink named like the program, so the process's name (comm) is
# redis-server, not ld-linux-x86-64; argv[0] is the wrapper's path.
# Bullseye's Redis loads lua-cjson with Lua's require, which searches
# LUA_CPATH (by default /usr/lib/x86_64-linux-gnu/lua/5.1, not the cache):
# where LIBS has Lua modules, the wrapper points LUA_CPATH there.
wrapper() {
  local file=$1 link=$2 libs=$3 bin=$4 env=""
  if [ -d "$libs/lua/5.1" ]; then
    env="LUA_CPATH='$libs/lua/5.1/?.so;;'
export LUA_CPATH
"
  fi
  cat >"$file" <<EOF
#!/bin/sh
# Written by .ci/engines.sh: $bin
# through the loader $(readlink "$link"), libraries from $libs.
${env}exec "$link" --library-path "$libs" --argv0 "\$0" "$bin" "\$@"
EOF
  chmod 755 "$file"
}

# wrappers ENGINE: the loader links and the redis-server and redis-cli
# wrappers of an unpacked engine, written anew on every run.
wrappers() {
  local e=$1 d="$dir/$1" server client
  read -r server client <<<"$(programs "$e")"
  mkdir -p "$d/bin" "$d/loader"
  ln -sfn "$(loader "$e" "$d/root")" "$d/loader/redis-server"
  ln -sfn "$(loader "$e" "$d/root")" "$d/loader/redis-cli"
  wrapper "$d/bin/redis-server" "$d/loader/redis-server" "$d/root/usr/lib/x86_64-linux-gnu" "$d/root/usr/bin/$server"
  wrapper "$d/bin/redis-cli" "$d/loader/redis-cli" "$d/root/usr/lib/x86_64-linux-gnu" "$d/root/usr/bin/$client"
}

# check ENGINE: the wrappers resolve every library, and the server starts on
# a unix socket and answers PING and EVAL, with the cjson library that every
# Redis has in its scripts.
check() {
  local e=$1 d="$dir/$1" out tmp pid rc=0
  # Trixie's binaries must not pick up one of bookworm's libraries.
  if [ "$(suite "$e")" = trixie ]; then
    for p in $(programs "$e"); do
      out=$("$d/loader/redis-server" --library-path "$d/root/usr/lib/x86_64-linux-gnu" --list "$d/root/usr/bin/$p" | grep '=>' | grep -v -e "=> $d/root/" -e "=> $d/loader/" || true)
      if [ -n "$out" ]; then
        echo "$e: $p loads libraries from outside $d/root:" >&2
        echo "$out" >&2
        return 1
      fi
    done
  fi
  "$d/bin/redis-server" --version >/dev/null || return 1
  "$d/bin/redis-cli" --version >/dev/null || return 1
  tmp=$(mktemp -d)
  "$d/bin/redis-server" --port 0 --unixsocket "$tmp/s" --save "" --appendonly no \
    --dir "$tmp" --daemonize no >"$tmp/log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    [ -S "$tmp/s" ] && break
    sleep 0.05
  done
  out=$("$d/bin/redis-cli" -s "$tmp/s" PING 2>&1 &&
    "$d/bin/redis-cli" -s "$tmp/s" EVAL "return redis.call('INCRBY', KEYS[1], ARGV[1])" 1 k 42 2>&1 &&
    "$d/bin/redis-cli" -s "$tmp/s" EVAL "return cjson.encode({1, 2})" 0 2>&1) || rc=1
  if [ "$out" != "$(printf 'PONG\n42\n[1,2]')" ]; then
    echo "$e: the server does not answer PING and EVAL (with cjson): $out" >&2
    tail -n 20 "$tmp/log" >&2
    rc=1
  fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
  return $rc
}

# setup ENGINE: download and unpack (wrappers writes the wrappers). It runs under
# set -e (never in a condition), so any failure stops the script; the
# engine's directory has no "ok" file then, and the next run sets it up anew.
setup() {
  local e=$1 s conf d debs p ver arch f want=() missing=()
  s=$(suite "$e")
  apt_for "$s"
  debs="$dir/debs/$s"
  mkdir -p "$debs"
  # The suite's current version of each package (security updates
  # included); a .deb already downloaded is kept, an older one removed.
  # shellcheck disable=SC2046
  while read -r p ver arch; do
    f="${p}_${ver//:/%3a}_${arch}.deb"
    want+=("$f")
    if [ ! -f "$debs/$f" ]; then
      find "$debs" -maxdepth 1 -name "${p}_*.deb" -delete
      missing+=("$p=$ver")
    fi
  done < <(APT_CONFIG="$conf" apt-cache show --no-all-versions $(packages "$e") |
    awk '/^Package:/ {p=$2} /^Version:/ {v=$2} /^Architecture:/ {a=$2} /^$/ && p {print p, v, a; p=""} END {if (p) print p, v, a}')
  if [ ${#want[@]} -ne "$(packages "$e" | wc -w)" ]; then
    echo "$e: $s does not have all of: $(packages "$e")" >&2
    return 1
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    (cd "$debs" && APT_CONFIG="$conf" apt-get -qq download "${missing[@]}")
  fi
  d="$dir/$e"
  rm -rf "$d"
  mkdir -p "$d/root"
  for f in "${want[@]}"; do
    dpkg-deb -x "$debs/$f" "$d/root"
    dpkg-deb -f "$debs/$f" Package Version | paste -sd' ' >>"$d/packages"
  done
}

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9 # one run at a time per cache directory

echo "== engines in $dir"
trap 'echo "engines.sh: setting up $e failed (line $LINENO)" >&2' ERR
# The package lists are only needed while setting engines up (each setup
# updates them first): 250 MB.
trap 'rm -rf "$dir/apt"' EXIT
failed=()
for e in "${engines[@]}"; do
  start=$SECONDS
  if [ ! -f "$dir/$e/ok" ]; then
    setup "$e"
  fi
  wrappers "$e"
  if ! check "$e"; then
    rm -f "$dir/$e/ok"
    failed+=("$e")
    continue
  fi
  touch "$dir/$e/ok"
  printf '%-11s %s (%ds)\n' "$e" "$("$dir/$e/bin/redis-server" --version)" $((SECONDS - start))
  printf '%-11s %s\n' "" "$dir/$e/bin/redis-server"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "engines that do not run: ${failed[*]}" >&2
  exit 1
fi
