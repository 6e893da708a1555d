"""llama.cpp at depth, priced again: a `run --decoder llamacpp` folder's measured speedups held per
prompt-length bucket against replay on the run's own llama.cpp prices, as replay prices them now.

A benchmark, not a test. The run's measurements (llamacpp.parquet: each prompt's generation phase on
both servers) are kept as they were; the replay record is made again (the target's greedy
continuations of the same prompts: deterministic), and each policy's prediction per bucket comes
from engines/llamacpp_run.by_bucket on the prices file the run used. So a change to how replay prices
(docs/depth.md#llamacpp-at-depth: the plain step at each depth) is checked against real llama-server
runs without timing them again. Prints each (policy, bucket) and the median |predicted / measured − 1|.

    dspark-bench run --decoder llamacpp --task long-code --limit 12 --max-new-tokens 64 --semantics llamacpp \
        --metric top1 --threshold 0 --threshold 0.3 --threshold 0.6 --gamma-max 3 --gamma-max 6 \
        --min-draft-len 0 --repeats 1 --out results/llamacpp-depth
    python -m benchmarks.checks.llamacpp_depth results/llamacpp-depth/<run folder>
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.engines.llamacpp_run import by_bucket, generation_speedup
from dspark_bench.harness.run import from_run_info, plan_run
from dspark_bench.measure.recording import record
from dspark_bench.replay import cost_file
from dspark_bench.replay.simulate import simulate_grid
from dspark_bench.results import read_json
from dspark_bench.tasks.prompts import encode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a `run --decoder llamacpp` folder over prompts of several buckets")
    folder = parser.parse_args().run
    info = read_json(folder / "llamacpp.json", "llama.cpp result")
    planned = plan_run(from_run_info(read_json(folder / "run.json", "run file")))
    pair, settings = planned.pair, planned.config.settings()
    eos = settings.eos_ids(pair)
    ids = [encode(pair.tokenizer, p.text, settings.chat_template) for p in planned.prompts]
    first = planned.configs[0]
    targets = [autoregressive_decode(pair.target, i, first, eos).tokens for i in ids]
    gamma = max(c.stopping.gamma_max for c in planned.configs)
    rec = record(pair, ids, first.verification.max_new_tokens, gamma, eos_ids=eos, continuations=targets)
    cost = cost_file.load(Path(info["prices"]["llamacpp"])).surface.at(1)
    measured = pd.read_parquet(folder / "llamacpp.parquet")
    errors = []
    print(f"{folder}: {len(ids)} prompts of {min(map(len, ids)):,}-{max(map(len, ids)):,} tokens; prices "
          f"{info['prices']['llamacpp']}")
    for c, policy in enumerate(planned.configs):
        rows = measured[measured["config_id"] == c]
        whole = generation_speedup(rows, policy.label())["speedup"]
        predicted = float(simulate_grid(rec, [policy], cost)["predicted_speedup"].iloc[0])
        print(f"  {policy.label():46} every prompt: measured {whole:.3f}, predicted {predicted:.3f} "
              f"({predicted / whole - 1:+.1%})")
        for part in by_bucket(rec, policy, rows, ids, planned.prompts, cost):
            errors.append(abs(part["error_llamacpp"]))
            print(f"  {policy.label():46} {part['bucket']:>7} ({part['prompts']} prompts): measured "
                  f"{part['llamacpp_speedup']:.3f} [{part['llamacpp_speedup_low']:.3f}, "
                  f"{part['llamacpp_speedup_high']:.3f}], predicted {part['predicted_llamacpp']:.3f} "
                  f"({part['error_llamacpp']:+.1%})")
    print(f"median |predicted / measured - 1| over {len(errors)} (policy, bucket): {np.median(errors):.1%}; "
          f"largest {max(errors):.1%}; within ±10 %: {sum(e <= 0.10 for e in errors)} of {len(errors)}")


if __name__ == "__main__":
    main()
