#!/usr/bin/env bash
# How the HTTP front end's library was chosen: the same small streaming server
# on Boost.Beast/Asio, libevent (evhttp), libmicrohttpd and cpp-httplib, each
# loaded with N streams that get a ~180-byte SSE chunk every 20 ms, while
# /health is probed every 100 ms on a new connection; then a client with a
# request held open (no answer yet, as while a request waits for its first
# token) leaves, and we see whether and when the server notices.
#
# Usage: bench/http_choice/run.sh [N...]   (default: 100 1000)
# Needs: apt-get install libboost1.81-dev libevent-dev libmicrohttpd-dev libcpp-httplib-dev
# Ports 18190-18199 on 127.0.0.1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
flags=(-O2 -std=c++20 -pthread)
g++ "${flags[@]}" "$here/beast_srv.cc" -o "$out/beast_srv"
g++ "${flags[@]}" "$here/libevent_srv.cc" -o "$out/libevent_srv" -levent -levent_pthreads
g++ "${flags[@]}" "$here/mhd_srv.cc" -o "$out/mhd_srv" -lmicrohttpd
g++ "${flags[@]}" "$here/httplib_srv.cc" -o "$out/httplib_srv" $(pkg-config --cflags --libs cpp-httplib)
g++ "${flags[@]}" "$here/load_client.cc" -o "$out/load_client"
ulimit -n "$(ulimit -Hn)"

port=18190
run() {  # run NAME N [server args...]
  local name=$1 n=$2
  shift 2
  port=$((port + 1))
  "$out/$name" "$port" 20 "$@" &
  local pid=$!
  sleep 0.5
  local t0 t1 threads rss
  t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  timeout 90 "$out/load_client" "$port" "$n" 8 >"$out/client.txt" &
  local client=$!
  sleep 6
  threads=$(awk '/^Threads/{print $2}' "/proc/$pid/status")
  rss=$(awk '/^VmRSS/{print $2}' "/proc/$pid/status")
  t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  if ! wait "$client"; then echo "(no answers: the load client was stopped after 90 s)" >"$out/client.txt"; fi
  printf '%-26s N=%-5s %s | threads %s, RSS %s kB, server CPU %.2f s in the first 5.5 s\n' \
    "$name $*" "$n" "$(tr '\n' ' ' <"$out/client.txt")" "$threads" "$rss" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print (b - a) / 100}')"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

for n in "${@:-100 1000}"; do
  for n1 in $n; do
    run beast_srv "$n1"
    run libevent_srv "$n1"
    run mhd_srv "$n1"
    run httplib_srv "$n1" 64
    run httplib_srv "$n1" 1100
  done
done
