#!/usr/bin/env bash
# Drafters side by side on the shipped pair's target (issue #15): the draft model, the target's
# multi-token heads and prompt lookup on 40 held-out code prompts, and lookup against the draft
# model on the copy-heavy `edit` task. Each sweep replays every drafter's policies from one record
# per drafter, then times each drafter's best scheduled policy, its best fixed γ (and the draft
# model's best goodput policy) in one interleaved run on the same prompts; the report puts the
# drafters side by side. About 40 minutes on a 2-core CPU.
set -euo pipefail
out=${1:-results/drafters}
dspark-bench sweep --task code --limit 40 --confirm-top 1 --drafter model --drafter heads --drafter lookup --out "$out/code"
dspark-bench sweep --task edit --limit 40 --confirm-top 1 --out "$out/edit"
for folder in "$out"/code/*/ "$out"/edit/*/; do
  [ -f "$folder/summary.json" ] && dspark-bench report "$folder"
done
