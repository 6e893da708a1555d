#!/usr/bin/env bash
# Kill the rollout step of a record from a continuations file mid-way (SIGKILL, once a third of
# the prompts are recorded), rerun it, and compare with an uninterrupted record of the same file.
#
#     bash benchmarks/kill_resume.sh [PROMPTS (40)] [TOKENS (128)]
#
# Prints how many prompts the kill left recorded, the rerun's own line (how many it kept from
# before), and whether the finished record equals the uninterrupted one array for array.
set -euo pipefail
n=${1:-40}
tokens=${2:-128}
work=$(mktemp -d)
flags=(--task code --limit "$n" --max-new-tokens "$tokens")
export COLUMNS=200
dspark-bench continuations write "${flags[@]}" --decoder ours --out "$work/c.jsonl" >/dev/null 2>&1

setsid dspark-bench sweep "${flags[@]}" --continuations "$work/c.jsonl" --shard 1/1 --out "$work/killed" \
    >"$work/killed.log" 2>&1 &
leader=$!
until [ "$(find "$work/killed" -name '[0-9]*.npz' 2>/dev/null | wc -l)" -ge $((n / 3)) ]; do sleep 0.1; done
kill -9 -- -"$leader"
wait "$leader" 2>/dev/null || true
echo "killed (SIGKILL) with $(find "$work/killed" -name '[0-9]*.npz' | wc -l) of $n prompts recorded"

dspark-bench sweep "${flags[@]}" --continuations "$work/c.jsonl" --shard 1/1 --out "$work/killed" >"$work/rerun.log" 2>&1
grep -o "recording from [^━]*" "$work/rerun.log" | head -1 | sed 's/^/rerun: /'
dspark-bench sweep "${flags[@]}" --continuations "$work/c.jsonl" --shard 1/1 --out "$work/whole" >/dev/null 2>&1

python - "$work" <<'PY'
import sys
from pathlib import Path

import numpy as np

from dspark_bench.replay.record import Record

work = Path(sys.argv[1])
(killed,) = [p.parent for p in (work / "killed" / "records").glob("*/record.json")]
(whole,) = [p.parent for p in (work / "whole" / "records").glob("*/record.json")]
a, b = Record.load(killed), Record.load(whole)
same = all(np.array_equal(getattr(a, n), getattr(b, n)) for n in ("continuation", "lengths", "rollout", "available"))
same = same and set(a.confidences) == set(b.confidences) and all(
    np.array_equal(a.confidences[m], b.confidences[m]) for m in a.confidences)
left = list((work / "killed" / "records").glob("*.parts"))
print(f"resumed record equals the uninterrupted one: {same}; parts folders left: {len(left)}")
PY
