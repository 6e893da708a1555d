"""Greedy-tuned against sampled-tuned, paired, at the traffic's temperature (issue 45).

    python -m benchmarks.measurements.temperature_verdict GREEDY_SWEEP SAMPLED_SWEEP --task prose --limit 20 --repeats 2

The best scheduled policy of a greedy replay sweep and that of a sweep of the same task replayed
at a temperature (their summary.json's "best"), both decoded at the second sweep's temperature
and top-p on held-out prompts of the task (its prompts after the first 20: sweeps take the
first 10), interleaved in one process with the plain baseline (harness/runner.run), and compared
on the same prompts (paired.compare: > 1, the sampled-tuned policy is faster), with its 95 %
interval and verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import parser
from dspark_bench.config import FIELDS, DecodeConfig
from dspark_bench.harness.models import load_pair
from dspark_bench.harness.runner import RunnerSettings, run
from dspark_bench.metrics import summarize
from dspark_bench.paired import compare
from dspark_bench.tasks import load_prompts


def best_of(folder) -> dict:
    return json.loads((folder / "summary.json").read_text())["best"][0]


def main() -> None:
    arguments = parser(__doc__, task="prose", limit=20, repeats=2)
    arguments.add_argument("greedy", type=Path, help="a greedy replay sweep's folder")
    arguments.add_argument("sampled", type=Path, help="the same task's sweep at the traffic's temperature")
    args = arguments.parse_args()
    greedy, chosen = best_of(args.greedy), best_of(args.sampled)
    knobs = {"temperature": chosen["temperature"], "top_p": chosen["top_p"], "max_new_tokens": chosen["max_new_tokens"]}
    configs = [DecodeConfig.of(**{**{k: row[k] for k in FIELDS}, **knobs}) for row in (greedy, chosen)]
    prompts, _, _ = load_prompts(args.task, None)
    held_out = prompts[20 : 20 + args.limit]
    pair = load_pair(None, None, "cpu")
    samples = run(pair, held_out, configs, RunnerSettings(repeats=args.repeats)).samples
    table = summarize(samples)
    for i, config in enumerate(configs):
        row = table[table["config_id"] == i].iloc[0]
        print(f"{['greedy-tuned', 'sampled-tuned'][i]}: {config.label()}: {row['speedup']:.3f}× "
              f"[{row['speedup_low']:.2f}, {row['speedup_high']:.2f}], tokens/round {row['tokens_per_round']:.2f}, "
              f"acceptance {row['acceptance_rate']:.2f}, draft {row['avg_draft_len']:.2f}")
    verdict = compare(samples[samples["config_id"] == 1], samples[samples["config_id"] == 0],
                      configs[1].label(), configs[0].label())
    print(f"at temperature {knobs['temperature']:g}, top-p {knobs['top_p']:g}, {len(held_out)} held-out {args.task} "
          f"prompts × {args.repeats} passes: sampled-tuned over greedy-tuned {verdict.ratio:.3f} "
          f"[{verdict.low:.3f}, {verdict.high:.3f}] — {verdict.verdict}")


if __name__ == "__main__":
    main()
