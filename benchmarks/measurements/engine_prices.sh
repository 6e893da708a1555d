#!/usr/bin/env bash
# Predictions priced on the engine that runs them, against that engine's measurements
# (docs/engines-and-export.md#priced-by-the-engine-you-deploy). A benchmark, not a test: run it on
# an otherwise idle machine (about 35 minutes on 2 CPU cores).
#
#   bash benchmarks/measurements/engine_prices.sh [results-folder] [prompts]
#
# Steps, all with --threads 1 (this 2-core VM's two-thread speed drifts by 20-30 % between
# llama-bench runs seconds apart; one thread by about 5 %):
#   1. fixed γ 1, 2, 3, 4, 6, 8 on llama.cpp beside replay priced on llama.cpp's costs and on ours
#      (the first run measures llama.cpp's costs: llama-bench, then fixed γ 5 and 7 on the task's
#      last 5 prompts; cached in $DSPARK_PRICES_HOME);
#   2. a replay sweep of every policy llama.cpp can run (top1 threshold under its rule), ranked on
#      llama.cpp's prices; `export --format llamacpp` of it;
#   3. the sweep's three best on llama.cpp, measured the same way;
#   4. three policies of HF assisted generation beside replay priced on HF's costs and on ours.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-results/engine-prices}
limit=${2:-20}
mkdir -p "$out/logs"
export DSPARK_PRICES_HOME=${DSPARK_PRICES_HOME:-$out/prices}
common=(--task code --limit "$limit" --max-new-tokens 128 --threads 1 --device cpu)
newest() { ls -td "$1"/*-"$2"-* | head -n 1; }

bash tools/build-llama-server.sh > /dev/null
dspark-bench run "${common[@]}" --decoder llamacpp --schedule fixed --gamma-max 1 --gamma-max 2 --gamma-max 3 \
    --gamma-max 4 --gamma-max 6 --gamma-max 8 --out "$out/fixed" | tee "$out/logs/fixed.txt"
dspark-bench sweep "${common[@]}" --prices llamacpp --metric top1 --schedule threshold --set 'space.semantics=[llamacpp]' \
    --set 'space.threshold={low: 0.05, high: 0.95, step: 0.05}' --gamma-max 2 --gamma-max 3 --gamma-max 4 \
    --gamma-max 5 --gamma-max 6 --gamma-max 8 --min-draft-len 0 --min-draft-len 1 --min-draft-len 2 --confirm-top 1 \
    --out "$out/sweep" | tee "$out/logs/sweep.txt"
dspark-bench export "$(newest "$out/sweep" sweep)" --format llamacpp --out "$out/export" | tee "$out/logs/export.txt"
# The sweep's three best llama.cpp policies on this pair (its trials.parquet, ranked on llama.cpp's
# prices; top1 threshold under llama.cpp's rule). They depend on the prices measured: read them from
# trials.parquet and put them here (2026-12-04: 0.3, 0.35 and 0.55, γ≤8, n-min 2).
dspark-bench run "${common[@]}" --decoder llamacpp --semantics llamacpp --metric top1 --schedule threshold \
    --threshold 0.3 --threshold 0.35 --threshold 0.55 --gamma-max 8 --min-draft-len 2 --out "$out/scheduled" \
    | tee "$out/logs/scheduled.txt"
dspark-bench run "${common[@]}" --decoder hf --semantics hf --min-draft-len 0 --threshold 0.2 --threshold 0.4 \
    --threshold 0.6 --gamma-max 6 --out "$out/hf" | tee "$out/logs/hf.txt"
