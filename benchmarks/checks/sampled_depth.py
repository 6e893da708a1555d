"""Sampled replay at depth against our real decoder on long prompts (issue 67, item 3).

    python -m benchmarks.checks.sampled_depth OUT            # real runs, then replay, then OUT/sampled-depth.md
    python -m benchmarks.checks.sampled_depth OUT --limit 8  # the long task's prompts 12 .. 19 (sweeps take 0 .. 11)

The long pair on `long-code` prompts past the first sweep's (627-3,700 tokens, every depth bucket the
task spans), 64 new tokens, at T = 1.0 and T = 0.7 (top-p 1). Real: our decoder's own speculative
sampling, SEEDS seeds per prompt and policy, pooled. Replay: one sampled record per temperature
(replay/sampled.py: PATHS paths per prompt × its coin draws), every policy replayed on it —
a depth policy among them, whose rounds take their bucket's entry. Tokens per round (emitted /
rounds) overall and per depth bucket of the rounds' starts: real against replay's 95 % interval
over prompts, and the paired difference (a bootstrap over prompts, the same prompts both sides)
against 1.96 of its standard error. Every job's result is a file: rerun to resume.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.depth import DEPTH_LABELS, depth_bucket, round_depths
from dspark_bench.harness.models import load_pair
from dspark_bench.measure import sampled_recording
from dspark_bench.replay import sampled
from dspark_bench.replay.simulate import simulate
from dspark_bench.tasks import load_prompts
from dspark_bench.tasks.prompts import encode

TOKENS, SEEDS, GAMMA, PATHS, FIRST = 64, 3, 6, 4, 12
SETTINGS = (1.0, 0.7)  # temperatures, top-p 1
POLICIES = {
    "fixed γ=3": dict(schedule="fixed", gamma_max=3, min_draft_len=0),
    "top1 0.3 γ≤6": dict(threshold=0.3, gamma_max=6, min_draft_len=0),
    "top1 0.6 γ≤6 min1": dict(threshold=0.6, gamma_max=6, min_draft_len=1),
    "depth 0.3/3·0.3/6·0.6/6·0.6/6": dict(schedule="depth", depth_policy="0.3/3,0.3/6,0.6/6,0.6/6", gamma_max=6,
                                          min_draft_len=0),
}


def config_of(temperature: float, policy: str) -> DecodeConfig:
    return DecodeConfig.of(max_new_tokens=TOKENS, temperature=temperature, top_p=1.0, **POLICIES[policy])


def by_bucket(prompt_tokens: int, rounds) -> np.ndarray:
    """[buckets, 4]: rounds, drafted, accepted, emitted of the rounds starting in each depth bucket."""
    out = np.zeros((len(DEPTH_LABELS), 4))
    for depth, r in zip(round_depths(prompt_tokens, [x.emitted for x in rounds]), rounds):
        out[int(depth_bucket(depth))] += (1, r.drafted, r.accepted, r.emitted)
    return out


def run_real(out: Path, pair, ids: list[list[int]]) -> None:
    for temperature in SETTINGS:
        for index, prompt in enumerate(ids):
            path = out / "real" / f"T{temperature:g}-{index:02d}.json"
            if path.is_file():
                continue
            started = time.perf_counter()
            result = {policy: sum(by_bucket(len(prompt), speculative_decode(
                pair.target, pair.draft, prompt, config_of(temperature, policy).replace(seed=100 + seed),
                pair.eos_ids).rounds) for seed in range(SEEDS)).tolist() for policy in POLICIES}
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))
            print(f"{path.name}: {time.perf_counter() - started:.0f} s", flush=True)


def run_replay(out: Path, pair, ids: list[list[int]]) -> None:
    for temperature in SETTINGS:
        path = out / "replay" / f"T{temperature:g}.json"
        if path.is_file():
            continue
        started = time.perf_counter()
        rec = sampled_recording.record_sampled(pair, ids, config_of(temperature, "fixed γ=3"), GAMMA, PATHS)
        result = {}
        for policy in POLICIES:
            totals = np.zeros((len(ids), len(DEPTH_LABELS), 4))
            for replicate in sampled.replicates(rec):
                for row, rounds in enumerate(simulate(replicate, config_of(temperature, policy))):
                    totals[row % len(ids)] += by_bucket(int(replicate.info["prompt_tokens"][row]), rounds)
            result[policy] = totals.tolist()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))
        print(f"{path.name}: recorded and replayed in {time.perf_counter() - started:.0f} s", flush=True)


def compare(real: np.ndarray, replay: np.ndarray, rng, draws: int = 4000) -> tuple:
    """Tokens per round (emitted / rounds over the prompts' totals [prompts, 4]): real, replay, replay's
    95 % interval over prompts, and the paired difference's bootstrap standard error."""
    def point(a, idx):
        return a[idx, 3].sum() / a[idx, 0].sum()

    picks = rng.integers(0, len(real), (draws, len(real)))
    mine = np.array([point(replay, p) for p in picks])
    diffs = mine - np.array([point(real, p) for p in picks])
    everyone = np.arange(len(real))
    return point(real, everyone), point(replay, everyone), np.percentile(mine, [2.5, 97.5]), diffs.std()


def report(out: Path, count: int) -> str:
    rng = np.random.default_rng(0)
    lines = ["| T | policy | depth bucket | rounds (real) | tokens/round real | replay [95 % CI] | diff ± 1.96·SE | "
             "real in replay's CI |", "|---|---|---|---|---|---|---|---|"]
    inside = total = 0
    for temperature in SETTINGS:
        stored = json.loads((out / "replay" / f"T{temperature:g}.json").read_text())
        real_runs = [json.loads((out / "real" / f"T{temperature:g}-{i:02d}.json").read_text()) for i in range(count)]
        for policy in POLICIES:
            real, replay = np.array([r[policy] for r in real_runs]), np.array(stored[policy])
            parts = [("all", real.sum(axis=1), replay.sum(axis=1))]
            parts += [(label, real[:, b], replay[:, b]) for b, label in enumerate(DEPTH_LABELS)
                      if real[:, b, 0].sum() >= 20]
            for label, r, p in parts:
                keep = (r[:, 0] > 0) & (p[:, 0] > 0)  # the prompts with rounds in the bucket, both sides
                truth, value, ci, se = compare(r[keep], p[keep], rng)
                ok = ci[0] <= truth <= ci[1]
                inside, total = inside + ok, total + 1
                lines.append(f"| {temperature:g} | {policy} | {label} | {int(r[:, 0].sum())} | {truth:.3f} | "
                             f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {value - truth:+.3f} ± {1.96 * se:.3f} | "
                             f"{'yes' if ok else '**no**'} |")
    lines += ["", f"Real tokens per round inside replay's 95 % interval: {inside} of {total}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int, default=8, help="prompts (the long task's, from the 13th)")
    args = parser.parse_args()
    pair = load_pair(None, None, "cpu", pair="long")
    prompts = load_prompts("long-code", None, limit=FIRST + args.limit)[0][FIRST:]
    ids = [encode(pair.tokenizer, p.text, "auto") for p in prompts]
    print(f"{len(ids)} prompts of {min(map(len, ids))}-{max(map(len, ids))} tokens", flush=True)
    run_real(args.out, pair, ids)
    run_replay(args.out, pair, ids)
    text = (f"Sampled replay at depth on long-code: {len(ids)} prompts of {min(map(len, ids))}-{max(map(len, ids))} "
            f"tokens, {TOKENS} new tokens, real: {SEEDS} seeds per prompt and policy; replay: {PATHS} paths per "
            f"prompt.\n\n" + report(args.out, len(ids)))
    (args.out / "sampled-depth.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
