"""Replay on the reference pair: what a record costs, how fast it simulates, and that it is exact.

A benchmark, not a test. On the default pair and a built-in task:

1. Recording against one plain decoding pass, per prompt, interleaved (plain, record, plain,
   record, ...): the ratio of summed times with a bootstrap 95 % interval over prompts.
2. `simulate_grid` on that record over the dense grid of issue 5 (4 metrics × 20 thresholds
   × 8 gamma_max × 4 min_draft_len, the valid points): policies per second, median of 3.
3. Replay against our real decoder, prompt by prompt: for policies spanning every metric and
   schedule with gamma_max / min_draft_len at their edges, every round of `simulate` compared
   with `speculative_decode`'s (drafted, accepted, emitted, stop reason, draft tokens, target
   token, draft forwards, confidences within 1e-5). Prints how many prompts and rounds were
   compared and how many differ.

    python -m benchmarks.measurements.replay_reference [--task code] [--limit 40] [--check-prompts 10]

The cost model's predicted-vs-measured speedup is in every replay sweep's summary
(`dspark-bench sweep --spec sweeps/code.yaml`), which times its best policies for real.
"""

from __future__ import annotations

import numpy as np

from benchmarks import common
from benchmarks.measurements.simulate_speed import G as GAMMA
from benchmarks.measurements.simulate_speed import grid, time_grid
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.harness.models import load_pair
from dspark_bench.harness.runner import timed
from dspark_bench.measure.recording import record
from dspark_bench.metrics import bootstrap_ratio
from dspark_bench.replay.simulate import Record, simulate, spanning_policies
from dspark_bench.tasks import load_task
from dspark_bench.tasks.prompts import encode


def recording_cost(pair, prompts: list[list[int]], tokens: int) -> list[Record]:
    config = DecodeConfig.of(max_new_tokens=tokens)
    autoregressive_decode(pair.target, prompts[0], config, pair.eos_ids)  # warm-up
    plain, recorded, records = [], [], []
    for ids in prompts:
        plain.append(timed(lambda: autoregressive_decode(pair.target, ids, config, pair.eos_ids), pair.device)[1])
        rec, seconds = timed(lambda: record(pair, [ids], tokens, GAMMA, topk=5), pair.device)
        recorded.append(seconds)
        records.append(rec)
    ratio, low, high = bootstrap_ratio(np.array(recorded), np.array(plain))
    print(f"1. recording {len(prompts)} prompts: {sum(recorded):.1f} s; one plain decoding pass: {sum(plain):.1f} s; "
          f"record / plain = {ratio:.2f}× [{low:.2f}, {high:.2f}] (gamma_record {GAMMA}, batched rollouts)")
    return records


def merge(records: list[Record]) -> Record:
    first = records[0]
    return Record(np.concatenate([r.continuation for r in records]), np.concatenate([r.lengths for r in records]),
                  np.concatenate([r.rollout for r in records]),
                  {m: np.concatenate([r.confidences[m] for r in records]) for m in first.confidences},
                  first.eos_ids, first.info)


def simulate_speed(rec: Record, tokens: int) -> None:
    configs = grid(tokens)
    _, median, table = time_grid(rec, configs)
    best = table.loc[table["tokens_per_round"].idxmax()]
    print(f"2. simulate_grid: {len(configs)} policies over {len(rec.lengths)} prompts × {tokens} tokens in "
          f"{median:.3f} s (median of 3) = {len(configs) / median:,.0f} policies/s; "
          f"best tokens_per_round {best['tokens_per_round']:.3f} ({best['config_label']})")


def equality(pair, prompts: list[list[int]], rec: Record, tokens: int) -> None:
    policies = spanning_policies(GAMMA, tokens)
    rounds_compared = differing = 0
    for config in policies:
        simulated = simulate(rec, config)
        for ids, mine in zip(prompts, simulated):
            real = speculative_decode(pair.target, pair.draft, ids, config, pair.eos_ids).rounds
            differing += abs(len(real) - len(mine))
            for a, b in zip(mine, real):
                same = (a.drafted, a.accepted, a.emitted, a.stop_reason, a.draft_tokens, a.target_token,
                        a.draft_forwards) == (b.drafted, b.accepted, b.emitted, b.stop_reason, b.draft_tokens,
                                              b.target_token, b.draft_forwards)
                close = len(a.confidences) == len(b.confidences) and np.allclose(a.confidences, b.confidences,
                                                                                 atol=1e-5)
                differing += not (same and close)
                rounds_compared += 1
    print(f"3. replay vs engine: {len(policies)} policies × {len(prompts)} prompts, {rounds_compared:,} rounds "
          f"compared, {differing} differ")


def main() -> None:
    parser = common.parser(__doc__, task="code", limit=40)
    parser.add_argument("--check-prompts", type=int, default=10)
    args = parser.parse_args()
    pair = load_pair(None, None)
    task_prompts = load_task(args.task, args.limit)
    tokens = 128
    prompts = [encode(pair.tokenizer, p.text) for p in task_prompts]
    print(f"{pair.target_name} / {pair.draft_name} on {pair.device} ({pair.dtype}); {len(prompts)} {args.task} "
          f"prompts × {tokens} new tokens")
    records = recording_cost(pair, prompts, tokens)
    rec = merge(records)
    simulate_speed(rec, tokens)
    check = args.check_prompts
    equality(pair, prompts[:check], merge(records[:check]), tokens)


if __name__ == "__main__":
    main()
