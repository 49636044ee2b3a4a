#!/usr/bin/env bash
# Build llama-bench (CUDA, sm_90) from the trimmed llama.cpp source tarball.
# Source: vendor/llama.cpp of the PyPI sdist llama_cpp_python-0.3.36
#         (upstream ggml-org/llama.cpp@0c1e57098 per the sdist CHANGELOG).
# Run from the repository root (where .llama/llama.tar.xz is). No network access is needed.
# The last line of stdout is the path of the llama-bench binary.
set -euo pipefail

SRC_DIR=/tmp/llama.cpp
BUILD_DIR="$SRC_DIR/build"
BIN="$BUILD_DIR/bin/llama-bench"

TARBALL="${LLAMA_TARBALL:-.llama/llama.tar.xz}"
if [ ! -f "$TARBALL" ]; then
    TARBALL="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/llama.tar.xz"
fi
[ -f "$TARBALL" ] || { echo "llama.tar.xz not found" >&2; exit 1; }

# nvcc may not be on PATH on a bare host
if ! command -v nvcc >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin /usr/local/cuda-13/bin; do
        if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
    done
fi
command -v nvcc >/dev/null 2>&1 || { echo "nvcc not found" >&2; exit 1; }
export CUDACXX="${CUDACXX:-$(command -v nvcc)}"
nvcc --version | tail -n 2 >&2

CMAKE_ARGS=(
    -G Ninja
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_CUDA=ON
    -DCMAKE_CUDA_ARCHITECTURES=90
    -DLLAMA_CURL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_SERVER=OFF
    # extras: none of these changes the CUDA kernels used for Q8_0/Q4_K weights + flash attention
    -DLLAMA_BUILD_APP=OFF                  # unified 'llama' binary links the (not built) server libs
    -DLLAMA_OPENSSL=OFF                    # no HTTPS/model download needed; avoids OpenSSL dependency
    -DGGML_CUDA_NCCL=OFF                   # single-GPU benchmark; skip NCCL lookup/linking
    -DGGML_CUDA_COMPRESSION_MODE=speed     # nvcc's default fatbin compression instead of 'size'
    -DGGML_CCACHE=OFF
    -DLLAMA_BUILD_COMMIT=0c1e57098         # no .git in the tarball; record upstream commit in llama-bench output
)

STAMP="$BUILD_DIR/.prep-stamp"
WANT="$(sha256sum "$TARBALL" | cut -d' ' -f1) ${CMAKE_ARGS[*]}"
if [ -x "$BIN" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    echo "llama-bench already built from this tarball; skipping rebuild" >&2
else
    rm -rf "$SRC_DIR"
    tar -C "$(dirname "$SRC_DIR")" -xJf "$TARBALL"   # top-level dir in the tarball is llama.cpp
    cmake -S "$SRC_DIR" -B "$BUILD_DIR" "${CMAKE_ARGS[@]}"
    time cmake --build "$BUILD_DIR" --target llama-bench -j16
    echo "$WANT" > "$STAMP"
fi

[ -x "$BIN" ] || { echo "llama-bench was not produced" >&2; exit 1; }
echo "$BIN"
