#!/usr/bin/env bash
# Every measurement of the shipped reference pair, in one go, on this machine (a benchmark,
# not a test). Run it on an otherwise idle machine: speedups are wall-clock ratios.
#
#   bash benchmarks/measurements/reference_pair.sh [results-folder]      (about 50 minutes on 2 CPU cores)
#
# Writes run folders under the results folder and the console output of each step under
# <results>/logs/. Steps: models info, our baseline vs model.generate, replay sweeps of code
# and prose, a real grid sweep, the bar run (best scheduled policy vs best fixed gamma on 20
# held-out code prompts), per-domain calibration, the CI regression baseline and the report.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-results}
logs=$out/logs
mkdir -p "$logs"
newest() { ls -td "$out"/*-"$1"-* | head -n 1; }

dspark-bench models info | tee "$logs/models_info.txt"
python -m benchmarks.measurements.baseline_vs_generate --task code --limit 5 --repeats 2 | tee "$logs/baseline_vs_generate.txt"

# One run per built-in task, with its per-category table (issue 3), and a few thresholds (issue 2).
dspark-bench tasks ls | tee "$logs/tasks_ls.txt"
for task in code prose structured mixed; do
    dspark-bench run --task "$task" --limit 6 --max-new-tokens 64 --threshold 0.4 --gamma-max 5 --repeats 1 \
        --out "$out" | tee "$logs/task_${task}.txt"
done
dspark-bench run --task code --limit 10 --threshold 0.2 --threshold 0.4 --threshold 0.6 --threshold 0.8 \
    --gamma-max 6 --repeats 1 --out "$out" | tee "$logs/thresholds_code.txt"

# Replay sweeps: one record per task, thousands of policies, the best confirmed by timed runs.
dspark-bench sweep --spec sweeps/code.yaml --limit 10 --out "$out" | tee "$logs/sweep_code.txt"
code_sweep=$(newest sweep)
dspark-bench sweep --spec sweeps/prose.yaml --limit 10 --confirm-top 3 --out "$out" | tee "$logs/sweep_prose.txt"
prose_sweep=$(newest sweep)

# A real grid sweep (every point decoded and timed): 4 thresholds x 3 gamma_max x 2 min_draft_len.
dspark-bench sweep --task code --evaluation real --limit 4 --max-new-tokens 64 \
    --threshold 0.2 --threshold 0.3 --threshold 0.5 --threshold 0.7 --gamma-max 3 --gamma-max 5 --gamma-max 8 \
    --min-draft-len 0 --min-draft-len 1 --out "$out" | tee "$logs/sweep_code_real_grid.txt"

# The bar: the best scheduled policy of each replay sweep and the best fixed gamma, on 20 held-out
# code prompts (2 timed pairs each) and 10 prose prompts (1 pair).
for pair in "code:$code_sweep:20:2" "prose:$prose_sweep:10:1"; do
    IFS=: read -r task sweep limit repeats <<< "$pair"
    flags=$(python - "$sweep" <<'EOF'
import json, sys
summary = json.load(open(f"{sys.argv[1]}/summary.json"))
best, classic = summary["best"][0], summary["classic"][0]
print(f"--metric {best['metric']} --schedule {best['schedule']} --threshold {best['threshold']} "
      f"--threshold-start {best['threshold_start']} --threshold-end {best['threshold_end']} "
      f"--gamma-max {best['gamma_max']} --min-draft-len {best['min_draft_len']} ::{classic['gamma_max']}")
EOF
)
    policy=${flags%%::*}; classic_gamma=${flags##*::}
    # shellcheck disable=SC2086
    dspark-bench run --task "$task" --limit "$limit" --repeats "$repeats" $policy --out "$out" | tee "$logs/bar_${task}_best.txt"
    dspark-bench run --task "$task" --limit "$limit" --repeats "$repeats" --schedule fixed --gamma-max "$classic_gamma" \
        --out "$out" | tee "$logs/bar_${task}_fixed.txt"
done

# All 40 held-out code prompts: the 10-prompt sweep's best policy and best fixed gamma timed
# together in one run, and a replay sweep over the 40; then replay's own costs and exactness.
python -m benchmarks.measurements.bar "$code_sweep" --limit 40 --repeats 1 --out "$out" | tee "$logs/bar_code40.txt"
dspark-bench sweep --spec sweeps/code.yaml --limit 40 --confirm-top 2 --out "$out" | tee "$logs/sweep_code40.txt"
python -m benchmarks.measurements.replay_reference --limit 40 --check-prompts 10 | tee "$logs/replay_reference.txt"
python -m benchmarks.measurements.simulate_speed | tee "$logs/simulate_speed.txt"

# The policy numbers `dspark-bench models info` shows, from the bar runs.
python -m benchmarks.measurements.collect_policy "$out" | tee "$logs/policy.txt"

# Per-domain calibration over code, prose and structured text.
mkdir -p "$out/calibration"
dspark-bench calibrate --tasks code,prose,structured --spec sweeps/default.yaml --limit 6 \
    --out "$out/calibration/calibration.yaml" --force | tee "$logs/calibrate.txt"

# The report of the code sweep.
dspark-bench report "$code_sweep" | tee "$logs/report_code.txt"
echo "done: code sweep $code_sweep, prose sweep $prose_sweep"

# The CI regression baseline (committed; .ci/run compares against it): 3 code + 3 prose prompts.
dspark-bench run --dataset results/baselines/ci-prompts.jsonl --max-new-tokens 48 --threshold 0.3 \
    --threshold 0.6 --gamma-max 4 --repeats 1 --out "$out/ci" | tee "$logs/ci_baseline_run.txt"
dspark-bench regress --baseline results/baselines/ci/summary.json --current "$(ls -td "$out"/ci/*-run-* | head -n 1)" \
    --update | tee "$logs/ci_baseline_update.txt"
