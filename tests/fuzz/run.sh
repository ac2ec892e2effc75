#!/bin/sh
# tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...] - runs each libFuzzer target
# (default: all) for SECONDS on a copy of its seed corpus (tests/fuzz/corpus),
# with a 10 s per-input timeout and a 2 GiB memory limit, $FUZZ_JOBS targets at
# a time (default: one per core).  Exits 1 when any target found something
# (crash, sanitizer report, leak, timeout, out of memory), printing the
# reproducer and the command that replays it; a finding's reproducer goes to
# tests/fuzz/regressions/<target>/ with its fix.
set -u
build=$1
secs=$2
shift 2
targets=${*:-requests arena attach_frame config mlp_weights trace snapshot}
jobs=${FUZZ_JOBS:-$(nproc)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
src=$(cd "$(dirname "$0")" && pwd)
work=$build/fuzz-work
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# One target: its log and exit status land in its work folder.
fuzz_one() {
  t=$1
  dir=$work/$t
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp "$src/corpus/$t/"* "$dir/corpus/" 2>/dev/null || true
  "$build/bin/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log" 2>&1
  echo $? >"$dir/rc"
}

running=0
for t in $targets; do
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait
    running=0
  fi
done
wait

failed=""
for t in $targets; do
  bin=$build/bin/fuzz_$t
  dir=$work/$t
  rc=$(cat "$dir/rc" 2>/dev/null || echo 99)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$dir/log" | tail -1)
  found=$(ls "$dir/artifacts" 2>/dev/null | head -1)
  if [ "$rc" -ne 0 ] || [ -n "$found" ]; then
    echo "fuzz_$t: FINDING (exit $rc) after ${execs:-?} executions; log: $dir/log"
    tail -40 "$dir/log" | sed 's/^/    /'
    for a in "$dir/artifacts/"*; do
      [ -e "$a" ] && echo "    reproducer: $a  (replay: $bin $a)"
    done
    failed="$failed $t"
  else
    echo "fuzz_$t: ok, ${execs:-?} executions in ${secs} s (${rate:-?} exec/s, ${cov:-cov ?}, corpus $(ls "$dir/corpus" | wc -l) inputs)"
  fi
done
n_all=0
for t in $targets; do n_all=$((n_all + 1)); done
n_fail=$(echo $failed | wc -w)
echo "fuzz: $((n_all - n_fail)) passed, $n_fail failed"
if [ -n "$failed" ]; then
  echo "make fuzz: findings in:$failed"
  exit 1
fi
