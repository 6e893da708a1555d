"""A finished replay sweep's headline, sharpened: its best scheduled policy and its best fixed γ
timed again on the same prompts, pass after pass (harness/verdicts.sharpen), until the paired
interval is within ±--precision or --budget seconds are spent; prints each policy's own
(unpaired) speedup interval and the paired one, after the sweep's one pass and after the last
(the docs/run.md#paired-verdicts table).

    python -m benchmarks.measurements.paired results/<sweep_id> --precision 0.03 --budget 900
"""

from __future__ import annotations

import functools
import json

import pandas as pd

from benchmarks.common import parser
from dspark_bench.engines.export import policy_of
from dspark_bench.harness.runner import another_pass
from dspark_bench.harness.verdicts import headline_verdict, sharpen
from dspark_bench.metrics import summarize
from dspark_bench.results import read_json
from dspark_bench.tuning.preparation import prepare
from dspark_bench.tuning.spec import parse_spec


def intervals(samples: pd.DataFrame, pair_ids: tuple[int, int], labels: dict) -> list[str]:
    """Each policy's own speedup [95 %] and the paired ratio, over the passes in `samples`."""
    own = summarize(samples[samples["config_id"].isin(pair_ids)]).set_index("config_id")
    lines = []
    for i in pair_ids:
        point, low, high = own.loc[i, ["speedup", "speedup_low", "speedup_high"]]
        lines.append(f"  {labels[i]}: speedup {point:.3f}× [{low:.3f}, {high:.3f}] (±{(high - low) / 2 / point:.1%})")
    verdict = headline_verdict(samples, pair_ids)
    lines.append(f"  paired: {verdict.ratio - 1:+.1%} [{verdict.low - 1:+.1%}, {verdict.high - 1:+.1%}] "
                 f"(±{verdict.half_width:.1%}) — {verdict.verdict}; "
                 f"{verdict.passes} pass(es) × {verdict.prompts} prompts")
    return lines


def main() -> None:
    cli = parser(__doc__, sweep=True)
    cli.add_argument("--precision", type=float, default=0.03,
                     help="target half-width of the paired interval (default 0.03)")
    cli.add_argument("--budget", type=float, default=900.0, help="seconds of further passes at most (default 900)")
    args = cli.parse_args()
    summary = json.loads((args.sweep / "summary.json").read_text())
    top = summary["headline"]
    pair_ids = (top["config_id"], top["reference_id"])
    spec = parse_spec(read_json(args.sweep / "run.json", "run file")["spec"], str(args.sweep))
    prepared = prepare(spec)
    trials = pd.read_parquet(args.sweep / "trials.parquet").set_index("config_id", drop=False)
    configs = {i: policy_of(trials.loc[i], args.sweep) for i in pair_ids}
    labels = {i: configs[i].label() for i in pair_ids}
    samples = pd.read_parquet(args.sweep / "samples.parquet")
    samples = samples[samples["config_id"].isin(pair_ids)]
    print(f"{args.sweep.name}: {labels[pair_ids[0]]} vs {labels[pair_ids[1]]}, {spec.limit} {spec.task} prompts")
    print("the sweep's confirmation (one pass):", *intervals(samples, pair_ids, labels), sep="\n")
    again = functools.partial(another_pass, prepared.pair, prepared.prompts, configs, spec.runner_settings())
    samples, state = sharpen(samples, pair_ids, again, args.precision, args.budget, print)
    print(f"after {state.passes} passes ({state.seconds:.0f} s of further passes; estimated "
          f"{'—' if state.estimate_s is None else f'{state.estimate_s:.0f} s'}):",
          *intervals(samples, pair_ids, labels), state.sentence(), sep="\n")


if __name__ == "__main__":
    main()
