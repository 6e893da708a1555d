"""Drafters side by side (issue 15): each drafter's best policy chosen by replay on a task's
prompts, then all of them timed in one run against the same autoregressive baseline.

Replay records each drafter's proposals once (the target's continuation decoded once for all),
simulates the task's sweep space (sweeps/<task>.yaml, every fixed γ included) for every drafter
and picks each one's best by predicted speedup; one `run` then times those policies on the same
prompts, each prompt's baseline and speculative decodes interleaved, and the report puts the
drafters side by side. The choice and the timing use the same prompts (in-sample). A benchmark,
not a test.

    python -m benchmarks.measurements.drafters --task code --limit 40 --drafter model heads lookup
    python -m benchmarks.measurements.drafters --task edit --limit 40 --drafter lookup model
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks import common
from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.harness.models import load_pair
from dspark_bench.harness.run import RunConfig, execute
from dspark_bench.measure.cost_model import measure_cost
from dspark_bench.measure.recording import record
from dspark_bench.objectives import rank
from dspark_bench.replay.simulate import simulate_grid
from dspark_bench.reporting.report import build_report
from dspark_bench.tasks import get_task, load_task
from dspark_bench.tasks.prompts import encode
from dspark_bench.tuning.replay_sweep import drafter_groups, replay_space
from dspark_bench.tuning.spec import base_config, points
from dspark_bench.tuning.spec_files import load_spec


def best_per_drafter(task: str, limit: int, drafters: list[str]) -> tuple[list[DecodeConfig], list[dict]]:
    spec = load_spec(Path("sweeps") / f"{task}.yaml", {"task": task, "limit": limit, "space.drafter": drafters})
    pair = load_pair()
    prompts = load_task(task, limit)
    base = base_config(spec, get_task(task).max_new_tokens)
    configs = [c for c in replay_space(points(spec, base), base) if not schedules.of(c).cost_aware]
    gamma = max(c.stopping.gamma_max for c in configs)
    ids = [encode(pair.tokenizer, p.text) for p in prompts]
    records, continuations, started = {}, None, time.perf_counter()
    for key, group in drafter_groups(configs).items():
        records[key] = rec = record(pair, ids, base.verification.max_new_tokens, gamma, base.stopping.topk, drafter=key,
                                    continuations=continuations)
        continuations = [rec.continuation[p, :n].tolist() for p, n in enumerate(rec.lengths)]
        print(f"recorded {key} ({time.perf_counter() - started:.0f} s)", flush=True)
    rec = next(iter(records.values()))
    context = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    cost = measure_cost(pair, context, gamma, drafters=tuple(drafters))
    best: dict[str, tuple] = {}
    for key, group in drafter_groups(configs).items():
        table = rank(simulate_grid(records[key], [configs[i] for i in group], cost), "speedup", "predicted_speedup")
        top = table.iloc[0]
        if key.drafter not in best or top["predicted_speedup"] > best[key.drafter][1]["predicted_speedup"]:
            best[key.drafter] = (configs[group[int(top["config_id"])]], top)
    rows = [{"drafter": d, "policy": c.label(), "predicted_speedup": float(t["predicted_speedup"]),
             "tokens_per_round_replayed": float(t["tokens_per_round"])} for d, (c, t) in best.items()]
    return [c for c, _ in best.values()], rows


def main() -> None:
    parser = common.parser(__doc__, task="code", limit=40, out="results/drafters")
    parser.add_argument("--drafter", nargs="+", default=["model", "heads", "lookup"])
    args = parser.parse_args()
    chosen, replayed = best_per_drafter(args.task, args.limit, args.drafter)
    for row in replayed:
        print(f"replay's best {row['drafter']}: {row['policy']} predicted {row['predicted_speedup']:.3f}×", flush=True)
    policies = tuple({k: v for k, v in c.to_dict().items() if k not in ("batch_size", "max_new_tokens")}
                     for c in chosen)
    folder, table = execute(RunConfig(task=args.task, limit=args.limit, policies=policies), args.out)
    report = build_report(folder)
    print(f"run folder: {folder}\nreport: {report}\n")
    print("| drafter | policy | predicted (replay) | speedup [95% CI] | "
          "tokens_per_round | acceptance_rate | identical |")
    print("|---|---|---|---|---|---|---|")
    for row, (_, measured) in zip(replayed, table.iterrows()):
        print(f"| {row['drafter']} | {measured['config_label']} | {row['predicted_speedup']:.2f}× | "
              f"{measured['speedup']:.2f}× [{measured['speedup_low']:.2f}, {measured['speedup_high']:.2f}] | "
              f"{measured['tokens_per_round']:.2f} | {measured['acceptance_rate']:.3f} | "
              f"{measured['identical_to_baseline']:.2f} |")


if __name__ == "__main__":
    main()
