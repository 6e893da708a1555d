"""Is the project's autoregressive baseline as fast as `model.generate`? (a benchmark, not a test)

Speedup is always measured against `decoding.autoregressive.autoregressive_decode`; this checks that it is not
a slow strawman. Per prompt, interleaved (A B C A B C ...), after a warm-up: our loop, plain
`model.generate`, and Hugging Face assisted generation with the draft. Prints tokens/s (median
over prompts) and the ratio of our loop to `generate` with a bootstrap 95 % interval.

    python -m benchmarks.measurements.baseline_vs_generate [--task code] [--limit 10] [--max-new-tokens 128]
"""

from __future__ import annotations

import statistics

import numpy as np

from benchmarks import common
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode, hf_generate
from dspark_bench.harness.models import load_pair
from dspark_bench.harness.runner import timed
from dspark_bench.metrics import bootstrap_ratio
from dspark_bench.tasks import load_task
from dspark_bench.tasks.prompts import encode


def main() -> None:
    parser = common.parser(__doc__, task="code", limit=10, max_new_tokens=128, repeats=3)
    parser.add_argument("--target")
    parser.add_argument("--draft")
    args = parser.parse_args()
    pair = load_pair(args.target, args.draft)
    config = DecodeConfig.of(max_new_tokens=args.max_new_tokens)
    prompts = [encode(pair.tokenizer, p.text) for p in load_task(args.task, args.limit)]
    methods = {
        "ours (autoregressive_decode)": lambda ids: autoregressive_decode(pair.target, ids, config, pair.eos_ids),
        "model.generate": lambda ids: hf_generate(pair.target, ids, config, pair.eos_ids),
        "generate(assistant_model=draft)": lambda ids: hf_generate(pair.target, ids, config, pair.eos_ids, pair.draft),
    }
    for fn in methods.values():  # warm-up
        fn(prompts[0])
    times = {name: [] for name in methods}
    tokens = {name: [] for name in methods}
    for ids in prompts:
        per_method, counts = {name: [] for name in methods}, {}
        for _ in range(args.repeats):
            for name, fn in methods.items():
                result, seconds = timed(lambda: fn(ids), pair.device)
                per_method[name].append(seconds)
                counts[name] = len(result.tokens)  # tokens from generated ids, never re-tokenised
        for name in methods:
            times[name].append(statistics.median(per_method[name]))
            tokens[name].append(counts[name])
    print(f"{pair.target_name} on {pair.device} ({pair.dtype}); {len(prompts)} {args.task} prompts × "
          f"{args.max_new_tokens} new tokens, median of {args.repeats} interleaved repeats")
    for name in methods:
        rates = np.array(tokens[name]) / np.array(times[name])
        print(f"  {name:34s} {np.median(rates):8.1f} tokens/s (median over prompts)")
    ours, plain = np.array(times["ours (autoregressive_decode)"]), np.array(times["model.generate"])
    ratio, low, high = bootstrap_ratio(plain, ours)
    print(f"  ours / model.generate speed ratio: {ratio:.2f}× [{low:.2f}, {high:.2f}] (> 1: ours is faster)")


if __name__ == "__main__":
    main()
