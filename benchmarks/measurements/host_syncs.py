"""Host syncs per round and CPU speed of our decoder before and after the device-side decoder
(issue 14), in one process, interleaved.

The decoder of an earlier commit (--before, default 06fb238: the last one before issue 14) is
loaded from git beside today's, as its own package. Each prompt is decoded by every variant in
turn (old, new early-stop, new verify-side), `--repeats` times, greedy and then sampling;
medians per prompt, and each variant's speed relative to the old engine as a ratio of summed
times with a 95 % bootstrap interval over prompts.

Syncs: today's engine counts its reads through host.fetch; the old one read tensors directly,
so every read of a tensor's value it makes (`float()`, `int()`, `.tolist()`, `.item()`, ...) is
counted by watching those methods, as tests/test_device.py watches today's for stray reads.

    python -m benchmarks.measurements.host_syncs [--before 06fb238] [--task code] [--limit 10]
                                    [--max-new-tokens 128] [--repeats 3]
"""

from __future__ import annotations

import importlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import torch

from benchmarks import common

ROOT = Path(__file__).resolve().parents[2]
READS = ("tolist", "item", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


def old_engine(rev: str):
    """The engine as of `rev` (a commit before the layers: dspark_bench/engine.py), with the package it
    imports, as `dspark_old`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "dspark_bench", ":!dspark_bench/reference"],
                             capture_output=True, check=True).stdout
    folder = Path(tempfile.mkdtemp())
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(folder, filter="data")
    (folder / "dspark_bench").rename(folder / "dspark_old")
    for path in (folder / "dspark_old").rglob("*.py"):
        path.write_text(path.read_text().replace("dspark_bench", "dspark_old"))
    sys.path.insert(0, str(folder))
    return importlib.import_module("dspark_old.engine"), importlib.import_module("dspark_old.config")


class Reads:
    """Counts reads of tensor values while active (old engine: each one is a host sync)."""

    def __init__(self):
        self.count, self.active = 0, False
        for name in READS:
            original = getattr(torch.Tensor, name)

            def watched(tensor, *args, _original=original, **kwargs):
                if self.active:
                    self.count += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, watched)


def main() -> None:
    from dspark_bench.config import DecodeConfig
    from dspark_bench.decoding import host, speculative
    from dspark_bench.harness.models import load_pair
    from dspark_bench.harness.runner import timed
    from dspark_bench.metrics import bootstrap_ratio
    from dspark_bench.tasks import load_task
    from dspark_bench.tasks.prompts import encode

    parser = common.parser(__doc__, task="code", limit=10, max_new_tokens=128, repeats=3)
    parser.add_argument("--before", default="06fb238")
    args = parser.parse_args()
    old, old_config = old_engine(args.before)
    pair = load_pair(device="cpu")
    prompts = [encode(pair.tokenizer, p.text) for p in load_task(args.task, args.limit)]
    # The shipped pair's tuned code policy (dspark_bench/reference/weights/policy.json).
    policy = dict(metric="margin", threshold=0.05, gamma_max=6, min_draft_len=2, max_new_tokens=args.max_new_tokens)
    reads = Reads()
    print(f"shipped pair on CPU · {len(prompts)} {args.task} prompts × {args.max_new_tokens} tokens · "
          f"margin threshold 0.05 γ≤6 min2 · medians of {args.repeats} interleaved repeats\n")
    print("| decoding | engine | host syncs per round | syncs per token | tokens/s | speed vs before [95 % CI] |")
    print("|---|---|---|---|---|---|")
    for temperature in (0.0, 0.8):
        variants = {
            f"before ({args.before})": (old.speculative_decode,
                                        old_config.DecodeConfig(**policy, temperature=temperature)),
            "after, early-stop": (speculative.speculative_decode, DecodeConfig.of(**policy, temperature=temperature)),
            "after, verify-side": (speculative.speculative_decode,
                                   DecodeConfig.of(**policy, temperature=temperature, draft_mode="verify-side")),
        }
        syncs, rounds, tokens, seconds = ({name: [] for name in variants} for _ in range(4))
        for ids in prompts[:1]:  # warm-up
            for decode, config in variants.values():
                decode(pair.target, pair.draft, ids, config, pair.eos_ids)
        for ids in prompts:
            per = {name: [] for name in variants}
            for repeat in range(args.repeats):
                for name, (decode, config) in variants.items():
                    result, t = timed(lambda: decode(pair.target, pair.draft, ids, config, pair.eos_ids), pair.device)
                    per[name].append(t)
            for name, (decode, config) in variants.items():  # counted apart from the timed decodes
                reads.count, reads.active = 0, True
                with host.counting() as fetched:
                    result = decode(pair.target, pair.draft, ids, config, pair.eos_ids)
                reads.active = False
                syncs[name].append(reads.count if name.startswith("before") else fetched.fetches)
                rounds[name].append(len(result.rounds))
                tokens[name].append(len(result.tokens))
                seconds[name].append(statistics.median(per[name]))
        base = next(iter(variants))
        for name in variants:
            rate = sum(tokens[name]) / sum(seconds[name])
            # speed vs before: (before's seconds per token) / (this one's), over prompts
            ratio, low, high = bootstrap_ratio(np.array(seconds[base]) / np.array(tokens[base]),
                                               np.array(seconds[name]) / np.array(tokens[name]))
            print(f"| {'greedy' if temperature == 0 else f'sampling T={temperature}'} | {name} | "
                  f"{sum(syncs[name]) / sum(rounds[name]):.2f} | {sum(syncs[name]) / sum(tokens[name]):.2f} | "
                  f"{rate:.1f} | {ratio:.3f} [{low:.3f}, {high:.3f}] |")


if __name__ == "__main__":
    main()
