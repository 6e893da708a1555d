"""The bar of issue 12: speedup against batch size, padded (measured) and packed (predicted).

One replay sweep with batch_size as a search dimension: record the shipped pair once on the
task's prompts, time the cost surface t_draft(B), t_verify(B, k) at each B, predict every
policy of the task's space (with the padded layout's batch-level rule, batch_quorum, searched
too) at every B in both layouts, then confirm the best scheduled policy
and the best fixed gamma at each B with real batched runs (padded layout, continuous batching,
interleaved with the batched autoregressive baseline). Prints the table the README carries and
leaves the sweep's run folder (`dspark-bench report` draws its batch-size figure).

    python -m benchmarks.measurements.concurrency [--task code] [--limit 32] [--max-new-tokens 128]
                                     [--batch-size 1 --batch-size 8 --batch-size 32] [--out results]
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from benchmarks import common
from dspark_bench.results import describe_machine, environment
from dspark_bench.tuning.spec_files import resolve_spec, task_spec
from dspark_bench.tuning.sweep import run_sweep


def main() -> None:
    parser = common.parser(__doc__, task="code", limit=32, max_new_tokens=128, out="results")
    parser.add_argument("--batch-size", type=int, action="append", dest="batch_sizes")
    parser.add_argument("--confirm-top", type=int, default=1)
    parser.add_argument("--quorum", type=float, action="append", dest="quorums",
                        help="batch_quorum values searched (default 0, 0.25, 0.5, 0.75; 0 = each row on its own)")
    args = parser.parse_args()
    batch_sizes = args.batch_sizes or [1, 8, 32]
    # The task's own space (sweeps/<task>.yaml), with the padded layout's batch-level rule searched too.
    spec, origin = resolve_spec(task_spec(args.task), {
        "task": args.task, "limit": args.limit, "max_new_tokens": args.max_new_tokens, "confirm_top": args.confirm_top,
        "space.batch_size": batch_sizes, "space.batch_quorum": args.quorums or [0.0, 0.25, 0.5, 0.75]})
    print(origin, flush=True)
    start = time.perf_counter()
    folder = run_sweep(spec, args.out, say=lambda line: print(line, flush=True)).folder
    print(f"{args.limit} {args.task} prompts × {args.max_new_tokens} new tokens · batch sizes "
          f"{', '.join(map(str, batch_sizes))} · {time.perf_counter() - start:.0f} s · machine: "
          f"{describe_machine(environment())}\n")
    print(markdown(folder))
    print(f"\nrun folder: {folder}")


def markdown(folder: Path) -> str:
    """The per-B table: measured (padded) speedups with intervals beside their predictions, then
    the predicted best scheduled / best fixed in both layouts."""
    summary = json.loads((folder / "summary.json").read_text())
    lines = ["| B | policy | measured speedup [95 % CI] | predicted (padded) | measured / predicted "
             "| autoregressive tok/s | speculative tok/s |", "|---|---|---|---|---|---|---|"]
    for entry in summary["by_batch_size"]:
        for row in sorted(entry["measured"], key=lambda r: r["schedule"] == "fixed"):
            lines.append(f"| {entry['batch_size']} | {row['config_label']} | {row['speedup']:.2f}× "
                         f"[{row['speedup_low']:.2f}, {row['speedup_high']:.2f}] | {row['predicted_speedup']:.2f}× | "
                         f"{row['speedup'] / row['predicted_speedup']:.2f} | {row['baseline_tokens_per_s']:.0f} | "
                         f"{row['spec_tokens_per_s']:.0f} |")
    lines += ["", "| B | layout | best scheduled (predicted) | best fixed γ (predicted) | scheduled / fixed |",
              "|---|---|---|---|---|"]
    for entry in summary["by_batch_size"]:
        for layout in ("padded", "packed"):
            best = entry[f"{layout}_predicted"]
            lines.append(f"| {entry['batch_size']} | {layout} | {best['best_scheduled']} "
                         f"{best['best_scheduled_speedup']:.2f}× | {best['best_fixed']} "
                         f"{best['best_fixed_speedup']:.2f}× | {best['scheduled_over_fixed']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    pd.set_option("display.width", 200)
    main()
