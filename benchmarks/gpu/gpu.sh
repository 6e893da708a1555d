#!/usr/bin/env bash
# The GPU run (the package benchmarks/gpu, `python -m benchmarks.gpu`): one command for any CUDA
# machine, from the repository root or anywhere; the package need not be installed (the repository
# root goes on PYTHONPATH). CI runs its dry run: bash benchmarks/gpu/gpu.sh --device cpu --smoke
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m benchmarks.gpu "$@"
