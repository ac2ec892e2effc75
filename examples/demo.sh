#!/bin/sh
# The demo (`make demo`): commitkvd on the host backend in a temporary
# directory, four worker processes with two sessions each writing K/V into
# daemon-owned shared memory and verifying every byte through the views,
# then the daemon's statistics, then a clean stop.
set -eu
BIN=${1:-build/bin}
DIR=$(mktemp -d /tmp/commitkv-demo.XXXXXX)
SOCK="ipc://$DIR/commitkvd.sock"
ATTACH="$DIR/commitkvd.attach"
cleanup() {
  if [ -n "${DPID:-}" ] && kill -0 "$DPID" 2>/dev/null; then kill -TERM "$DPID"; wait "$DPID" || true; fi
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM

echo "== commitkvd (host backend) in $DIR"
"$BIN/commitkvd" --socket "$SOCK" --attach-socket "$ATTACH" --state-dir "$DIR" --memory 1G \
  --set daemon.log_level=notice 2>"$DIR/commitkvd.log" &
DPID=$!
i=0
while [ ! -S "$ATTACH" ]; do
  i=$((i + 1))
  if [ $i -gt 100 ] || ! kill -0 "$DPID" 2>/dev/null; then echo "commitkvd did not start:"; cat "$DIR/commitkvd.log"; exit 1; fi
  sleep 0.05
done
"$BIN/commitkvctl" --socket "$SOCK" --attach-socket "$ATTACH" status

echo "== 4 workers x 2 sessions: synthetic K/V (the real-model worker comes with the quality issue)"
PIDS=""
for w in 1 2 3 4; do
  "$BIN/commitkv-worker" --socket "$SOCK" --attach-socket "$ATTACH" --prefix "worker$w" --sessions 2 \
    --rounds 40 --tokens 32 --layers 8 --kv-heads 4 --head-dim 64 --seed "$w" --keep --quiet >"$DIR/worker$w.out" 2>&1 &
  PIDS="$PIDS $!"
done
# progress while they run
while :; do
  running=0
  for p in $PIDS; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
  tokens=$("$BIN/commitkvctl" --socket "$SOCK" --attach-socket "$ATTACH" stats --json 2>/dev/null |
    sed -n 's/.*"tokens": {"draft": \([0-9]*\).*/\1/p')
  printf '   %d workers running, %s tokens cached\n' "$running" "${tokens:-?}"
  [ "$running" -eq 0 ] && break
  sleep 0.5
done
fail=0
for p in $PIDS; do wait "$p" || fail=1; done
cat "$DIR"/worker*.out
[ "$fail" -eq 0 ] || { echo "a worker failed"; exit 1; }

echo "== sessions"
"$BIN/commitkvctl" --socket "$SOCK" --attach-socket "$ATTACH" sessions
echo "== stats"
"$BIN/commitkvctl" --socket "$SOCK" --attach-socket "$ATTACH" stats
echo "== stopping commitkvd (SIGTERM)"
kill -TERM "$DPID"
wait "$DPID"
DPID=""
echo "commitkvd stopped cleanly"
