"""Write the reference pair's policy numbers (shown by `dspark-bench models info`) from the bar runs.

    python -m benchmarks.measurements.collect_policy RESULTS   (after reference_pair.sh's bar runs)
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import common

WEIGHTS = Path(__file__).resolve().parents[2] / "dspark_bench" / "reference" / "weights"


def run_folder(log: Path) -> Path:
    return Path(log.read_text().split("run folder:")[-1].split()[0])


def policy_row(out: Path, task: str) -> dict:
    best_folder = run_folder(out / "logs" / f"bar_{task}_best.txt")
    fixed_folder = run_folder(out / "logs" / f"bar_{task}_fixed.txt")
    config = json.loads((best_folder / "run.json").read_text())["configs"][0]
    best = json.loads((best_folder / "summary.json").read_text())["configs"][0]
    fixed = json.loads((fixed_folder / "summary.json").read_text())["configs"][0]
    keys = ("tokens_per_round", "acceptance_rate", "speedup", "speedup_low", "speedup_high", "identical_to_baseline")
    return {
        "policy": best["config_label"], **{k: best[k] for k in keys}, "prompts": best["prompts"],
        "fixed_gamma": {"policy": fixed["config_label"], **{k: fixed[k] for k in keys}},
        "command": f"dspark-bench run --task {task} --limit {best['prompts']} --metric {config['metric']} "
                   f"--schedule {config['schedule']} --threshold {config['threshold']} "
                   f"--gamma-max {config['gamma_max']} --min-draft-len {config['min_draft_len']}",
        "run": best_folder.name,
    }


if __name__ == "__main__":
    parser = common.parser(__doc__)
    parser.add_argument("results", type=Path, nargs="?", default=Path("results"),
                        help="the results folder of benchmarks/measurements/reference_pair.sh (default results)")
    out = parser.parse_args().results
    rows = {task: policy_row(out, task) for task in ("code", "prose")}
    (WEIGHTS / "policy.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(json.dumps(rows, indent=2))
