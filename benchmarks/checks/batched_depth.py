"""Batched replay at depth against the batched decoder: a finished sweep at B > 1 over long prompts,
its confirmed policies' measured speedups beside replay's predictions priced at each step's depth
(the sweep's own) and at one depth (as batched replay priced them before issue 67).

A benchmark, not a test. The sweep's measurements (trials.parquet's confirmed rows: each policy
and the batched baseline decoded in turns on the same prompts) are kept as they were; the record
is the sweep's own (its records folder); the predictions come from predict_batched on the sweep's
cost_surface.json, once as it is (every B timed at depth: replay/step_prices.py) and once with the
depth axis dropped at B > 1 (every step priced at the surface's one depth, the sweep's halfway
rows). Prints each policy's measured speedup [95 % CI], both predictions and their errors
(predicted / measured − 1), and writes batched-depth.md beside the sweep.

    dspark-bench sweep --task long-code --limit 12 --max-new-tokens 64 --batch-size 8 --confirm-top 3
    python -m benchmarks.checks.batched_depth results/<sweep folder>
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks import common
from dspark_bench.engines.run_policies import policy_of
from dspark_bench.harness.served_run import with_signals
from dspark_bench.metrics import summarize
from dspark_bench.replay import sampled
from dspark_bench.replay.batched import predict_batched
from dspark_bench.replay.cost import CostSurface
from dspark_bench.results import read_json


def one_depth(surface: CostSurface) -> CostSurface:
    """`surface` with its B > 1 timed at one depth only: what batched replay priced with before."""
    models = {b: m if b == 1 else dataclasses.replace(m, by_depth={}) for b, m in surface.models.items()}
    return CostSurface(models, surface.terms)


def sweep_record(folder):
    """The sweep's draft-model record (its records folder beside the sweep's)."""
    found = [d for d in sorted((folder.parent / "records").iterdir()) if (d / "record.json").is_file()]
    return sampled.load(next(d for d in found if "lookup" not in d.name and "heads" not in d.name))


def run_rows(run: Path, sweep, rec) -> pd.DataFrame:
    """A run folder's policies at B > 1, measured (summarize's columns), each with its config; refused
    unless the run decoded the sweep's prompts to the sweep's tokens (the record it is predicted on)."""
    info, other = read_json(run / "run.json", "run file"), read_json(sweep / "run.json", "run file")
    tokens = {c.get("max_new_tokens") for c in info.get("configs") or [info.get("config") or {}]}
    if info["prompts"].get("fingerprint") != other["prompts"].get("fingerprint") or (
            tokens != {other["spec"]["max_new_tokens"]}):
        raise SystemExit(f"{run} did not decode the sweep's prompts to its tokens: run it with the sweep's "
                         "--task, --limit and --max-new-tokens")
    samples = pd.read_parquet(run / "samples.parquet")
    measured = summarize(samples)
    measured = measured[measured["batch_size"] > 1].reset_index(drop=True)
    first = samples.groupby("config_id").first()
    measured["config"] = [policy_of(first.loc[i], run) for i in measured["config_id"]]
    return measured


def main() -> None:
    argv = common.parser(__doc__, sweep=True)
    argv.add_argument("--run", type=Path, action="append", default=[], help="a run folder at B > 1 (repeatable)")
    args = argv.parse_args()
    folder = args.sweep
    trials = pd.read_parquet(folder / "trials.parquet")
    confirmed = trials[(trials["source"] == "confirmed") & (trials["batch_size"] > 1)].reset_index(drop=True)
    if confirmed.empty:
        raise SystemExit(f"{folder} confirmed no policy at a batch size above 1: "
                         "sweep with --batch-size 8 --confirm-top 3")
    confirmed["config"] = [policy_of(row, folder) for _, row in confirmed.iterrows()]
    rec = sweep_record(folder)
    surface = CostSurface.from_dict(read_json(folder / "cost_surface.json", "cost surface"))
    rows = pd.concat([confirmed.assign(source=f"sweep {folder.name}"),
                      *(run_rows(run, folder, rec).assign(source=f"run {run.name}") for run in args.run)],
                     ignore_index=True)
    configs = list(rows["config"])
    rec = with_signals(rec, configs)
    at_depth = predict_batched(rec, configs, surface)["predicted_speedup"].to_numpy()
    if not np.allclose(at_depth[: len(confirmed)], confirmed["predicted_speedup"], rtol=1e-9):  # the sweep's rows first
        raise SystemExit("replay here does not give the sweep's own predictions: the sweep was made by another build")
    flat = predict_batched(rec, configs, one_depth(surface))["predicted_speedup"].to_numpy()
    measured = rows["speedup"].to_numpy()
    lines = [f"Batched replay at depth against the batched decoder: sweep {folder.name}'s record and prices, "
             f"B = {sorted(set(rows['batch_size']))}, {len(rec.lengths)} prompts.", "",
             "| measured in | policy | measured [95 % CI] | predicted, each step at its depth | error | "
             "predicted, one depth | error | the target's own text |", "|---|---|---|---|---|---|---|---|"]
    for i, row in rows.iterrows():
        same = row.get("identical_to_baseline")
        lines.append(f"| {row['source']} | {row['config_label']} | {measured[i]:.3f} [{row['speedup_low']:.3f}, "
                     f"{row['speedup_high']:.3f}] | {at_depth[i]:.3f} | {at_depth[i] / measured[i] - 1:+.1%} | "
                     f"{flat[i]:.3f} | {flat[i] / measured[i] - 1:+.1%} | "
                     f"{'—' if pd.isna(same) else ('yes' if same else '**no**')} |")
    errors = {name: np.abs(values / measured - 1) for name, values in (("at depth", at_depth), ("one depth", flat))}
    lines += ["", "; ".join(f"{name}: median |error| {np.median(e):.1%}, largest {e.max():.1%}"
                            for name, e in errors.items())]
    text = "\n".join(lines)
    (folder / "batched-depth.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
