#!/usr/bin/env bash
# llama.cpp as the one-stream peer (issue 38), built once from source and cached.
#
#   benchmarks/llama_cpp_peer.sh build          # venv with llama-cpp-python + llama-server (long, once)
#   benchmarks/llama_cpp_peer.sh build-server   # llama-server alone
#   benchmarks/llama_cpp_peer.sh python         # prints the venv's python (fails if not built)
#   benchmarks/llama_cpp_peer.sh server         # prints the llama-server binary (fails if not built)
#   benchmarks/llama_cpp_peer.sh quantize FILE.gguf   # F16, Q8_0, Q4_K_M copies beside FILE, prints their paths
#
# Both the Python binding and llama-server come from the SAME sdist (llama-cpp-python 0.3.36 vendors
# llama.cpp), so the in-process and the HTTP peer run the same kernels. -DGGML_NATIVE=ON: the peer
# gets every ISA extension of this machine, as modelcall's own kernels do.
# NOTE: on a quiet 2-core Zen 4 the pip build takes ~12 min (NOTES.md); on 2 cores shared with ~7 busy agents
# (load 10-15, nice 19) the binding and llama-server, built side by side, took about an hour each (2026-12-04).
# Never part of `make test`. One build of each part at a time (a lock file per part).
set -euo pipefail

VERSION=0.3.36
CACHE="${MODELCALL_BENCH_CACHE:-$HOME/.cache/modelcall/bench}/llama-cpp-$VERSION"
VENV="$CACHE/venv"
SRC="$CACHE/src"
SERVER="$CACHE/build/bin/llama-server"
BUILD_CMD="benchmarks/llama_cpp_peer.sh build"

need_built() {
  if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    echo "llama.cpp peer not built: run '$BUILD_CMD' (once: 12 min to an hour on 2 cores; log in $CACHE/build.log)" >&2
    exit 3
  fi
}

locked() {  # locked NAME: hold $CACHE/NAME.lock for the rest of this process, or stop
  exec {fd}>"$CACHE/$1.lock"
  flock -n "$fd" || { echo "another build of the $1 is running (lock $CACHE/$1.lock)" >&2; exit 4; }
}

build_binding() {
  locked binding
  if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    echo "binding: already built in $VENV"
    return
  fi
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  mkdir -p "$SRC"
  "$VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$SRC" "llama-cpp-python==$VERSION"
  CMAKE_ARGS="-DGGML_NATIVE=ON" nice -n 19 "$VENV/bin/pip" install -v --no-binary llama-cpp-python \
    "$SRC/llama_cpp_python-$VERSION.tar.gz"
}

build_server() {
  locked server
  if [[ -x "$SERVER" ]]; then
    echo "server: already built at $SERVER"
    return
  fi
  command -v cmake >/dev/null || apt-get install -y cmake
  local tarball="$SRC/llama_cpp_python-$VERSION.tar.gz"
  [[ -f "$tarball" ]] || "$VENV/bin/pip" download -q --no-deps --no-binary :all: -d "$SRC" "llama-cpp-python==$VERSION"
  [[ -d "$SRC/llama_cpp_python-$VERSION" ]] || tar -xzf "$tarball" -C "$SRC"
  local tree="$SRC/llama_cpp_python-$VERSION/vendor/llama.cpp"
  nice -n 19 cmake -S "$tree" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF
  nice -n 19 cmake --build "$CACHE/build" --target llama-server -j "$(nproc)"
}

case "${1:-}" in
  build)
    mkdir -p "$CACHE"
    build_binding   # then the server (`build-server` in a second shell runs it beside this one)
    build_server
    echo "built: $VENV/bin/python and $SERVER"
    ;;
  build-server)   # the server alone (e.g. beside a binding build still running)
    mkdir -p "$CACHE"
    build_server
    ;;
  python)
    need_built
    echo "$VENV/bin/python"
    ;;
  server)
    if [[ ! -x "$SERVER" ]]; then
      echo "llama-server not built: run '$BUILD_CMD' (log in $CACHE/build.log)" >&2
      exit 3
    fi
    echo "$SERVER"
    ;;
  quantize)
    need_built
    [[ $# -eq 2 && -f "$2" ]] || { echo "usage: $0 quantize FILE.gguf (an existing file)" >&2; exit 2; }
    "$VENV/bin/python" "$(dirname "$0")/llama_cpp_quantize.py" "$2"
    ;;
  *)
    echo "usage: $0 build | build-server | python | server | quantize FILE.gguf" >&2
    exit 2
    ;;
esac
