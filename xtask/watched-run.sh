#!/bin/sh
# Benchmark variant for `cargo xtask bench --compare watched=xtask/watched-run.sh`:
# runs the engine with its API on and a watcher for the whole run, so the
# cost of being watched is measured. WATCHER=chromium (default): headless
# Chromium showing the live view — on the same 2 cores, so its own CPU use
# competes with the engine; WATCHER=poll: what the page asks of the engine
# (the graph once, /api/stats and /metrics every second) without a browser.
# LOGBUS_BIN selects the engine binary (default: the release build).
bin=${LOGBUS_BIN:-${CARGO_TARGET_DIR:-target}/release/logbus}
port=$((20000 + $$ % 20000))
exec 3<&0
"$bin" "$@" --api "127.0.0.1:$port" <&3 &
engine=$!
profile=$(mktemp -d)
if [ "${WATCHER:-chromium}" = poll ]; then
  ( sleep 0.2; curl -s "http://127.0.0.1:$port/api/graph" >/dev/null
    while kill -0 "$engine" 2>/dev/null; do
      curl -s "http://127.0.0.1:$port/api/stats" >/dev/null
      curl -s "http://127.0.0.1:$port/metrics" >/dev/null
      sleep 1
    done ) &
  browser=$!
else
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --remote-debugging-port=0 "http://127.0.0.1:$port/" \
  >/dev/null 2>&1 &
browser=$!
fi
wait "$engine"
rc=$?
kill "$browser" 2>/dev/null
wait "$browser" 2>/dev/null
rm -rf "$profile"
exit "$rc"
