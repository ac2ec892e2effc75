#!/bin/sh
# bench-gpu.sh - builds the CUDA kernels and their benchmark (ckv-bench-gpu)
# and runs it: GB/s of each kernel against the GPU's peak memory bandwidth
# (read from the device), and fused attention at 4K/32K/128K tokens.
# Usage: kernels/cuda/bench-gpu.sh [--json] [--mib N]   (env BUILD_DIR, JOBS)
# Without a GPU the benchmark reports "skipped" and exits 0.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-"$ROOT/build-gpu"}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCKV_WITH_CUDA=ON >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target ckv-bench-gpu
exec "$BUILD_DIR/bin/ckv-bench-gpu" "$@"
