#!/bin/sh
# bench/peer/build.sh BUILD_DIR - the honest peer of `commitkv-bench kernels --peer PATH`
# (issue 42): ggml's CPU library from the llama.cpp source inside the npm package
# node-llama-cpp (package/llama/gitRelease.bundle, a git bundle of llama.cpp, MIT),
# built into BUILD_DIR/peer/ with the CPU's own SIMD level (GGML_NATIVE, as our kernels
# pick theirs at run time), and bench/peer/ggml_peer.c linked against it:
# BUILD_DIR/peer/bin/ckv-ggml-peer.  Run by `make bench-peer`; never part of the CMake
# build, commitkvd, libcommitkv or CI.  Needs npm (the registry), git, cmake and a C++
# compiler; exits non-zero with one line on stderr when something is missing, and
# `commitkv-bench kernels --peer PATH` then says "skipped" in its peer fields.
set -eu
VERSION=3.21.1
src=$(cd "$(dirname "$0")" && pwd)
out=${1:-build}/peer
mkdir -p "$out/bin"
out=$(cd "$out" && pwd)
cd "$out"
jobs=${JOBS:-2}

if [ ! -f "node-llama-cpp-$VERSION.tgz" ]; then
  command -v npm >/dev/null 2>&1 || { echo "bench-peer: npm not found" >&2; exit 1; }
  npm pack --silent "node-llama-cpp@$VERSION" >/dev/null 2>npm-pack.log ||
    { echo "bench-peer: npm pack node-llama-cpp@$VERSION failed (registry unreachable?), see $out/npm-pack.log" >&2; exit 1; }
fi
if [ ! -d llama.cpp/.git ]; then
  rm -rf package llama.cpp
  tar xzf "node-llama-cpp-$VERSION.tgz" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  git clone -q package/llama/gitRelease.bundle llama.cpp 2>git-clone.log ||
    { echo "bench-peer: git clone of the bundle failed, see $out/git-clone.log" >&2; exit 1; }
fi
if [ ! -f ggml-build/ggml/src/libggml-cpu.a ] || [ ! -f ggml-build/ggml/src/libggml-base.a ]; then
  # the whole tree configured (ggml/ alone lacks files in this bundle), only ggml's CPU libraries built
  cmake -S llama.cpp -B ggml-build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >cmake.log 2>&1 ||
    { echo "bench-peer: configuring llama.cpp failed, see $out/cmake.log" >&2; exit 1; }
  nice cmake --build ggml-build -j "$jobs" --target ggml-cpu >build.log 2>&1 ||
    { echo "bench-peer: building ggml-cpu failed, see $out/build.log" >&2; exit 1; }
fi
${CC:-cc} -O2 -std=c11 -Wall -Wextra -I llama.cpp/ggml/include "$src/ggml_peer.c" \
  ggml-build/ggml/src/libggml-cpu.a ggml-build/ggml/src/libggml-base.a -fopenmp -lstdc++ -lm -lpthread \
  -o bin/ckv-ggml-peer
echo "$out/bin/ckv-ggml-peer (llama.cpp $(cat package/llama/llama.cpp.info.json 2>/dev/null | tr -d ' \n'), $(git -C llama.cpp rev-parse --short HEAD))"
