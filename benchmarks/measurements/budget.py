"""The bars of issue 27, per batch size, from a replay sweep over batch sizes: autoregressive, the
best fixed γ, the best scheduled policy on a raw metric, the best on the learned signal, the budget
schedule and the oracle — predicted padded and packed, measured padded with intervals where the
sweep confirmed them — the learned signal's held-out quality beside the raw metrics', and the share
of the oracle's gain the rules would capture with better signals (analysis/signal_headroom.py).

    dspark-bench sweep --task code --limit 40 --batch-size 1 --batch-size 4 --batch-size 8 \\
        --batch-size 16 --batch-size 32 --batch-size 64 --confirm-top 1 --out results
    python -m benchmarks.measurements.budget results/<the sweep's folder>
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from benchmarks import common
from dspark_bench.analysis.oracle import KINDS, captured_cell
from dspark_bench.analysis.signal_headroom import pivot
from dspark_bench.objectives import rank

COLUMNS = {"padded": "predicted_speedup", "packed": "predicted_speedup_packed"}


def kinds(group: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The policies of one batch size by the kind the table shows."""
    out = {"fixed γ": group[group["schedule"] == "fixed"]}
    names = {"raw": "raw metrics", "learned": "learned signal", "budget": "budget"}
    out.update({names[kind]: group[members(group)] for kind, members in KINDS.items()})
    return out


def measured(part: pd.DataFrame) -> str:
    done = part[part["speedup"].notna()] if "speedup" in part else part.iloc[:0]
    if done.empty:
        return "—"
    top = rank(done, "speedup", "speedup").iloc[0]
    return f"{top['speedup']:.3f} [{top['speedup_low']:.3f}, {top['speedup_high']:.3f}] ({top['config_label']})"


def main(folder: Path) -> None:
    table = pd.read_parquet(folder / "trials.parquet")
    summary = json.loads((folder / "summary.json").read_text())
    # The analyses (headroom, signals, better signals): analysis.json (`dspark-bench analyze`), or an older summary's.
    if (folder / "analysis.json").is_file():
        summary.update(json.loads((folder / "analysis.json").read_text()))
    oracle = {(r["batch_size"], r["layout"]): r for r in summary["headroom"]}
    print(f"# {folder.name}: {summary.get('timing_health', {}).get('headline', '')}\n")
    for batch_size, group in table.groupby("batch_size", sort=True):
        print(f"## B = {batch_size}\n")
        print("| policy | predicted padded | predicted packed | measured padded [95 % CI] |")
        print("|---|---|---|---|")
        print("| autoregressive | 1.000 | 1.000 | 1.000 |")
        for name, part in kinds(group).items():
            cells = []
            for layout, column in COLUMNS.items():
                if part.empty or (batch_size == 1 and layout == "packed"):
                    cells.append("—" if part.empty else cells[0])
                    continue
                top = rank(part, "speedup", column).iloc[0]
                cells.append(f"{top[column]:.3f} ({top['config_label']})")
            print(f"| {name} | {cells[0]} | {cells[1]} | {measured(part)} |")
        bounds = [oracle.get((int(batch_size), layout))
                  for layout in (("—",) if batch_size == 1 else ("padded", "packed"))]
        cells = [f"{b['oracle_speedup']:.3f} ({b['oracle']}; captured {captured_cell(b['captured'])})" if b else "—"
                 for b in bounds]
        print(f"| oracle | {cells[0]} | {cells[-1]} | — |\n")
    print("| signal | tokens | AUC | Brier | ECE |\n|---|---|---|---|---|")
    for row in summary.get("signals") or []:
        print(f"| {row['signal']} | {row['tokens']:,} | {row['auc']:.3f} | {row['brier']:.4f} | {row['ece']:.4f} |")
    if summary.get("signal_headroom"):  # how good a signal the rules would need (analysis/signal_headroom.py)
        header, body = pivot(summary["signal_headroom"])
        print("\nShare of the oracle's gain the best per-row rule captures, by signal "
              "(AUC in-sample, its cost left out):\n")
        print("| B | layout | oracle over fixed γ | " + " | ".join(header) + " |\n|---|---|---|" + "---|" * len(header))
        for b, layout, gain, *shares in body:
            print(f"| {b} | {layout} | {gain:+.1%} | " + " | ".join(captured_cell(c) for c in shares) + " |")


if __name__ == "__main__":
    main(common.parser(__doc__, sweep=True).parse_args().sweep)
