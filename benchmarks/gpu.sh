#!/usr/bin/env bash
# The GPU benchmark (benchmarks/gpu.py): one command for any CUDA machine, from the repository
# root or anywhere. CI runs it as a smoke test: bash benchmarks/gpu.sh --device cpu --smoke
set -euo pipefail
cd "$(dirname "$0")/.."
exec python benchmarks/gpu.py "$@"
