#!/usr/bin/env bash
# Replay the same sweep before and after a change: `bash benchmarks/checks/replay_equality.sh REV`
# sweeps with the code at REV (a git worktree) and with the working tree, each recording its own
# record, priced on one committed cost-model file so that predictions do not depend on this
# machine's timings; then this working tree's benchmarks/checks/replay_equality.py compares what both
# replayed (so REV may predate it, or any move of it).
set -euo pipefail
rev=${1:?usage: bash benchmarks/checks/replay_equality.sh REV}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
git -C "$root" worktree add -q --detach "$work/before" "$rev"
trap 'git -C "$root" worktree remove --force "$work/before"' EXIT
prices="$root/benchmarks/gpu/inputs/cpu-prices-shipped-pair.json"
for side in before after; do
  code=$([ "$side" = before ] && echo "$work/before" || echo "$root")
  (cd "$code" && PYTHONPATH="$code" python -m dspark_bench.cli sweep --task code --limit 6 --max-new-tokens 48 \
     --confirm-top 0 --prices "$prices" --out "$work/$side" > "$work/$side.log" 2>&1) || { tail -3 "$work/$side.log"; exit 1; }
done
python "$root/benchmarks/checks/replay_equality.py" "$work"/before/*-sweep-* "$work"/after/*-sweep-*
