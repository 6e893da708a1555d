"""The bar of issue 8: a replay sweep's best scheduled policy and best fixed gamma, timed on a
task's held-out prompts in one run (a benchmark, not a test).

Both policies run in one process, each prompt's baseline and speculative decodes interleaved,
so they share the machine's drift. Prints the table and the run folder it wrote.

    python -m benchmarks.measurements.bar results/<sweep run> [--limit 40] [--repeats 1] [--out results]
"""

from __future__ import annotations

import json

import pandas as pd

from benchmarks import common
from dspark_bench.config import POLICY_FIELDS
from dspark_bench.harness.run import RunConfig, execute, plan_run
from dspark_bench.results import describe_machine, environment


def main() -> None:
    args = common.parser(__doc__, sweep=True, limit=40, repeats=1, out="results").parse_args()
    info = json.loads((args.sweep / "run.json").read_text())
    summary = json.loads((args.sweep / "summary.json").read_text())
    base = info["base_config"]
    policies = tuple({**base, **{k: row[k] for k in POLICY_FIELDS}}
                     for row in (summary["best"][0], summary["classic"][0]))
    task = info["prompts"]["task"]
    # The run's whole config, as `run` would build it: run.json keeps it, `run --config` repeats it.
    config = RunConfig(target=info["spec"]["target"], draft=info["spec"]["draft"], task=task, limit=args.limit,
                       policies=policies, repeats=args.repeats)
    planned = plan_run(config)
    folder, table = execute(config, args.out, planned=planned)
    prompts = planned.prompts
    print(f"{len(prompts)} held-out {task} prompts × {base['max_new_tokens']} new tokens, {args.repeats} timed pair(s)")
    print(f"machine: {describe_machine(environment())}")
    # The spread across prompts: each prompt's own speedup (seconds per token, baseline over speculative).
    per_prompt = pd.read_parquet(folder / "samples.parquet").groupby("config_id")["speedup"]
    spread = per_prompt.quantile([0.0, 0.5, 1.0]).unstack()
    print("| policy | tokens_per_round | acceptance_rate | speedup [95 % CI] | "
          "per-prompt min / median / max | identical |")
    print("|---|---|---|---|---|---|")
    for row in table.itertuples():
        low, mid, high = spread.loc[row.config_id]
        print(f"| {row.config_label} | {row.tokens_per_round:.3f} | {row.acceptance_rate:.3f} | "
              f"{row.speedup:.2f}× [{row.speedup_low:.2f}, {row.speedup_high:.2f}] | "
              f"{low:.2f} / {mid:.2f} / {high:.2f} | {row.identical_to_baseline:.3f} |")
    print(f"run folder: {folder}")


if __name__ == "__main__":
    main()
