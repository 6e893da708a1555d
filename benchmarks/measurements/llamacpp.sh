#!/usr/bin/env bash
# The exported llama.cpp policy of a sweep, run by a real llama-server beside our decoder and
# replay (a benchmark, not a test; docs/engines-and-export.md's llama.cpp table). Run it on an
# otherwise idle machine: speedups are wall-clock ratios.
#
#   bash benchmarks/measurements/llamacpp.sh [results-folder] [prompts]      (about 10 minutes on 2 CPU cores)
#
# Steps: build llama-server (cached), a replay sweep of the code task, `export --format llamacpp`
# (the nearest policy llama.cpp can run, replayed), then `run --decoder llamacpp` with the
# exported file's knobs on the prompts the sweep tuned on.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-results}
limit=${2:-20}
mkdir -p "$out/logs"
newest() { ls -td "$out"/*-"$1"-* | head -n 1; }

server=$(bash tools/build-llama-server.sh)
dspark-bench sweep --task code --limit "$limit" --confirm-top 1 --out "$out" | tee "$out/logs/llamacpp_sweep.txt"
sweep=$(newest sweep)
dspark-bench export "$sweep" --format llamacpp | tee "$out/logs/llamacpp_export.txt"
flags=$(grep -v '^#' "$sweep/export/llama_cpp_flags.txt")
value() { python3 -c "import shlex,sys; w=shlex.split(sys.argv[1]); print(w[w.index(sys.argv[2]) + 1])" "$flags" "$1"; }
dspark-bench run --task code --limit "$limit" --max-new-tokens 128 --repeats 3 --semantics llamacpp \
    --threshold "$(value --spec-draft-p-min)" --gamma-max "$(value --spec-draft-n-max)" \
    --min-draft-len "$(value --spec-draft-n-min)" --decoder llamacpp --llama-server "$server" --out "$out" \
    | tee "$out/logs/llamacpp_run.txt"
