#!/bin/sh
# The demo (`make demo`): commitkvd on the host backend in a temporary
# directory, four worker processes with two sessions each (the real model
# stories260K when it is found, whose KV cache lives in the daemon; synthetic
# K/V otherwise), progress while they run, per-session fidelity, the daemon's
# per-session and total tables, every policy side by side with a plot, then a
# clean stop.
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
"$BIN/commitkvd" --backend host --socket "$SOCK" --attach-socket "$ATTACH" --state-dir "$DIR" --memory 1G \
  --set daemon.log_level=notice 2>"$DIR/commitkvd.log" &
DPID=$!
i=0
while [ ! -S "$ATTACH" ]; do
  i=$((i + 1))
  if [ $i -gt 100 ] || ! kill -0 "$DPID" 2>/dev/null; then echo "commitkvd did not start:"; cat "$DIR/commitkvd.log"; exit 1; fi
  sleep 0.05
done
"$BIN/commitkvctl" --socket "$SOCK" --attach-socket "$ATTACH" status

# The real model when it is found (CKV_MODEL, else ../shared/models), the
# synthetic worker otherwise: say which.
MODEL=${CKV_MODEL:-}
[ -z "$MODEL" ] && [ -n "${CKV_MODEL_DIR:-}" ] && MODEL="$CKV_MODEL_DIR/stories260K.bin"
[ -z "$MODEL" ] && MODEL="../shared/models/stories260K.bin"
PIDS=""
if [ -f "$MODEL" ] && [ -x "$BIN/commitkv-llm" ]; then
  echo "== 4 workers x 2 sessions: the real model ($MODEL), 20 rounds each, fidelity against a private FP16 shadow"
  for w in 1 2 3 4; do
    "$BIN/commitkv-llm" --socket "$SOCK" --attach-socket "$ATTACH" --model "$MODEL" --prefix "llm$w" --sessions 2 \
      --rounds 20 --seed "$w" --shadow --keep --quiet >"$DIR/worker$w.out" 2>&1 &
    PIDS="$PIDS $!"
  done
else
  echo "== 4 workers x 2 sessions: synthetic K/V (model not found at $MODEL)"
  for w in 1 2 3 4; do
    "$BIN/commitkv-worker" --socket "$SOCK" --attach-socket "$ATTACH" --prefix "worker$w" --sessions 2 \
      --rounds 40 --tokens 32 --layers 8 --kv-heads 4 --head-dim 64 --seed "$w" --keep --quiet >"$DIR/worker$w.out" 2>&1 &
    PIDS="$PIDS $!"
  done
fi
# progress while they run
while :; do
  running=0
  for p in $PIDS; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
  line=$("$BIN/commitkvctl" --socket "$SOCK" --attach-socket "$ATTACH" stats --json 2>/dev/null |
    sed -n 's/.*"tokens": {"draft": \([0-9]*\), "staged": \([0-9]*\), "committed": \([0-9]*\), "recycled": \([0-9]*\)}, "bytes": {[^}]*"total": \([0-9]*\), "fp16_equivalent": \([0-9]*\)}.*/draft \1, staged \2, committed \3, recycled \4; \5 of \6 FP16 bytes/p')
  printf '   %d workers running: %s\n' "$running" "${line:-starting}"
  [ "$running" -eq 0 ] && break
  sleep 0.5
done
fail=0
for p in $PIDS; do wait "$p" || fail=1; done
echo "== per session (fidelity: next-token top-1 agreement and KL against FP16)"
cat "$DIR"/worker*.out
[ "$fail" -eq 0 ] || { echo "a worker failed"; exit 1; }

# The agent model answering recall questions from its context, through this
# daemon: commitkv's answers beside its private FP16 shadow's and the
# expected sentence, then one verdict line.
AGENTLM=${CKV_AGENTLM_MODEL:-$(dirname "$0")/../tools/agentlm/agentlm.bin}
DIALOGUES=${CKV_MODEL_DIR:-../shared/models}/agent-dialogues.jsonl
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
if [ -f "$AGENTLM" ] && [ -f "$DIALOGUES" ] && [ -x "$BIN/commitkv-dialogue" ]; then
  echo "== the agent model ($AGENTLM) answers recall questions of 12 public dialogues: commitkv vs FP16"
  # commitkv with the shipped defaults (the worker scores turns from their text, --semantic entities), and the
  # kivi2 baseline (every token past the last 32 in INT2) on the same dialogues
  if "$BIN/commitkv-dialogue" --socket "$SOCK" --attach-socket "$ATTACH" --model "$AGENTLM" --dialogues "$DIALOGUES" \
    --limit 12 --policy commitkv --sync --shadow --json --quiet >"$DIR/dialogue.json" 2>"$DIR/dialogue.err" &&
    "$BIN/commitkv-dialogue" --socket "$SOCK" --attach-socket "$ATTACH" --model "$AGENTLM" --dialogues "$DIALOGUES" \
      --limit 12 --policy kivi2 --prefix kivi2 --param sink_tokens=0 --param recent_window=32 --sync --shadow --json \
      --quiet >"$DIR/kivi2.json" 2>>"$DIR/dialogue.err"; then
    "$PY" - "$DIR/dialogue.json" "$DIR/kivi2.json" <<'PYEOF'
import json, sys
j, kj = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
kivi = {(it["id"], it["turn"]): it for it in kj["items"]}
items = j["items"]
# a few questions, the hardest first: those FP16 and commitkv answer differently, then far ones
items.sort(key=lambda it: (it.get("shadow_ok") == it["ok"], -it["distance"]))
mark = lambda ok: "ok  " if ok else "MISS"
for it in items[:6]:
    k = kivi.get((it["id"], it["turn"]), {})
    print("  Q: %s   (%s, %d bytes back)" % (it["question"], it["kind"], it["distance"]))
    print("     expected: %s" % it["expected"])
    print("     fp16      %s %s" % (mark(it.get("shadow_ok")), it.get("shadow_said", "").rstrip("\n")))
    print("     commitkv  %s %s" % (mark(it["ok"]), it["said"].rstrip("\n")))
    print("     kivi2     %s %s" % (mark(k.get("ok")), k.get("said", "").rstrip("\n")))
print("  %-26s %8s %8s %8s" % ("policy", "bytes", "recall", "KL"))
print("  %-26s %8.3f %8.3f %8s" % ("fp16 (the shadow)", 1.0, j["shadow_recall"] or 0.0, "-"))
for name, r in (("commitkv (defaults)", j), ("kivi2 (past the last 32)", kj)):
    print("  %-26s %8.3f %8.3f %8.5f" % (name, r["bytes_ratio_fp16"], r["recall"], r["kl_mean"] or 0.0))
print("verdict: commitkv (defaults) kept %.3f of FP16's bytes with recall %.3f against FP16's %.3f "
      "(%d questions), KL %.5f; kivi2 %.3f with recall %.3f"
      % (j["bytes_ratio_fp16"], j["recall"], j["shadow_recall"] or 0.0, j["questions"], j["kl_mean"] or 0.0,
         kj["bytes_ratio_fp16"], kj["recall"]))
PYEOF
  else
    echo "   (commitkv-dialogue failed:)"; tail -3 "$DIR/dialogue.err"
  fi
else
  echo "== (no agent model at $AGENTLM or no dialogues at $DIALOGUES: the recall questions are skipped)"
fi

echo "== sessions"
"$BIN/commitkvctl" --socket "$SOCK" --attach-socket "$ATTACH" sessions
echo "== stats"
"$BIN/commitkvctl" --socket "$SOCK" --attach-socket "$ATTACH" stats
# Memory per round and memory against fidelity for every policy, side by side.
PLOT="${BIN%/bin}/demo-quality.png"
if "$BIN/commitkv-bench" quality --quick --plot "$PLOT" >"$DIR/quality.txt" 2>&1; then
  echo "== policies side by side (commitkv-bench quality --quick): plot in $PLOT"
  sed -n '/^agent-synthetic/,$p' "$DIR/quality.txt"
else
  echo "== (the quality comparison could not run: see below)"
  tail -5 "$DIR/quality.txt"
fi
echo "== stopping commitkvd (SIGTERM)"
kill -TERM "$DPID"
wait "$DPID"
DPID=""
echo "commitkvd stopped cleanly"
