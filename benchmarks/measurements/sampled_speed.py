"""What replay under sampling costs (issue 45): recording, in plain passes, and replay's speed.

    python -m benchmarks.measurements.sampled_speed --task code --paths 4   # 10 prompts, 128 tokens, T 1.0

On the shipped pair and the task's first prompts (its sweep's), at the temperature given:
- recording: each path recorded (measure/sampled_recording.record_path: the sampled plain decode that draws
  the path, one forward of each model along it, the rejected tokens and the draft's rollouts)
  beside a plain sampled decode of the same prompt and seed, interleaved path by path in one
  process; the ratio per path, its median and range;
- replay: every policy of the task's sweep space (the sweep's own, fixed γ, goodput and budget
  included) replayed on that record's replicates and pooled into expectations
  (tuning/replay_sweep.priced), priced on a committed cost-model file so that the number does
  not depend on a timing; the median of 3 passes after a first one (numba's compile or cache).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import parser
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.goodput import GoodputModel
from dspark_bench.measure import sampled_recording
from dspark_bench.replay import cost_file, sampled
from dspark_bench.replay.acceptance import fit_record
from dspark_bench.results import write_json
from dspark_bench.tasks.prompts import encode
from dspark_bench.tuning.added_policies import budget_points, goodput_points
from dspark_bench.tuning.preparation import prepare
from dspark_bench.tuning.replay_sweep import replay_space, replayed
from dspark_bench.tuning.spec_files import resolve_spec

PRICES = Path(__file__).resolve().parents[1] / "gpu" / "inputs" / "cpu-prices-shipped-pair.json"


def main() -> None:
    arguments = parser(__doc__, task="code", limit=10, max_new_tokens=128)
    arguments.add_argument("--temperature", type=float, default=1.0, help="the traffic's temperature (default 1.0)")
    arguments.add_argument("--paths", type=int, default=None, help="sampled paths per prompt (default: the sweep's)")
    args = arguments.parse_args()
    spec, origin = resolve_spec(None, {"task": args.task, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
                                       "temperature": args.temperature,
                                       **({"paths": args.paths} if args.paths else {})})
    prepared = prepare(spec)
    pair, base = prepared.pair, prepared.base
    configs = replay_space(prepared.points, base)
    gamma = max(c.stopping.gamma_max for c in configs)
    ids = [encode(pair.tokenizer, p.text, spec.chat_template) for p in prepared.prompts]
    ratios, parts, started = [], [], time.perf_counter()
    for p, prompt in enumerate(ids):
        for k in range(spec.paths):
            seed = base.verification.seed + sampled.SEED_STRIDE * p + k
            t0 = time.perf_counter()
            autoregressive_decode(pair.target, prompt, base.replace(seed=seed), pair.eos_ids)
            t1 = time.perf_counter()
            parts.append(sampled_recording.record_path(pair, prompt, base, gamma, base.stopping.topk, seed,
                                                       pair.eos_ids))
            ratios.append((time.perf_counter() - t1) / (t1 - t0))
    rows = [ids_ for ids_ in ids for _ in range(spec.paths)]
    rec = sampled.assemble(parts, rows, base.verification.max_new_tokens, gamma, base.stopping.topk, pair.eos_ids,
                           base.drafting, {"sampling": sampled.sampling_of(base, spec.paths)})
    print(f"{origin}; temperature {args.temperature:g}; {len(ids)} prompts × {spec.paths} paths × "
          f"{args.max_new_tokens} tokens recorded in {time.perf_counter() - started:.0f} s (plain passes included)")
    print(f"recording a path / a plain sampled decode of it: median {statistics.median(ratios):.2f}, "
          f"range {min(ratios):.2f}–{max(ratios):.2f} ({len(ratios)} paths)")
    prices = cost_file.load(str(PRICES))
    cost = prices.surface.at(1)
    # The policies goodput and budget add (their model: the fit on this record's replicates).
    model = Path(tempfile.mkdtemp()) / "goodput_model.json"
    write_json(model, GoodputModel.build(fit_record(sampled.as_one(rec)), prices.surface).to_dict())
    configs = configs + goodput_points(configs, model) + budget_points(configs, model)
    replayed(rec, configs[:1], prices.surface, cost, False)  # numba: compiled or loaded from its cache
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        table = replayed(rec, configs, prices.surface, cost, False)
        times.append(time.perf_counter() - t0)
    print(f"replay: {len(table):,} policies × {len(sampled.replicates(rec))} replicates "
          f"({sampled.DRAWS} coin draws each) in {statistics.median(times):.2f} s (median of 3: "
          f"{', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
