#!/bin/sh
# Benchmark variant for `cargo xtask bench --compare watched=xtask/watched-run.sh`:
# runs the engine with its API on and a watcher for the whole run, so the
# cost of being watched is measured. WATCHER=chromium (default): headless
# Chromium showing the live view; WATCHER=poll: what the page asks of the
# engine (the graph once, /api/stats and /metrics every second) without a
# browser; WATCHER=none: the API on and nobody asking.
# WATCHER_CPUS=LIST runs the watcher under `taskset -c LIST`: with
# `cargo xtask bench --cpus 0` and WATCHER_CPUS=1 the engine (API threads
# included) and the browser get a core each, so the figure is the engine's
# cost of being watched, not the browser's CPU use.
# LOGBUS_BIN selects the engine binary (default: the release build).
bin=${LOGBUS_BIN:-${CARGO_TARGET_DIR:-target}/release/logbus}
port=$((20000 + $$ % 20000))
pin=""
if [ -n "${WATCHER_CPUS:-}" ]; then pin="taskset -c $WATCHER_CPUS"; fi
exec 3<&0
"$bin" "$@" --api "127.0.0.1:$port" <&3 &
engine=$!
profile=$(mktemp -d)
browser=""
case "${WATCHER:-chromium}" in
poll)
  $pin sh -c "sleep 0.2; curl -s http://127.0.0.1:$port/api/graph >/dev/null
    while kill -0 $engine 2>/dev/null; do
      curl -s http://127.0.0.1:$port/api/stats >/dev/null
      curl -s http://127.0.0.1:$port/metrics >/dev/null
      sleep 1
    done" &
  browser=$!
  ;;
none) ;;
*)
  $pin chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --remote-debugging-port=0 "http://127.0.0.1:$port/" \
    >/dev/null 2>&1 &
  browser=$!
  ;;
esac
wait "$engine"
rc=$?
if [ -n "$browser" ]; then
  kill "$browser" 2>/dev/null
  wait "$browser" 2>/dev/null
fi
rm -rf "$profile"
exit "$rc"
