"""Replay under sampling against our real decoder, in distribution (issue 45's validation).

    python -m benchmarks.checks.sampled_replay OUT --part 1/2 &   # real sampled runs, half the jobs
    python -m benchmarks.checks.sampled_replay OUT --part 2/2 &   # the other half (one core each)
    python -m benchmarks.checks.sampled_replay OUT --replay       # the sampled records, replayed
    python -m benchmarks.checks.sampled_replay OUT --report       # the table: OUT/validation.md

On the shipped pair, 20 held-out prompts of code and of prose (each task's last 20: sweeps take
the first 10), 128 tokens, at T = 0.7, T = 1.0 and T = 1.0 with top-p 0.9. Real: our decoder's
own speculative sampling, 5 seeds per prompt and policy, pooled (rounds, drafted, accepted and
emitted tokens summed). Replay: one sampled record per domain and setting (replay/sampled.py:
4 paths per prompt × 4 coin draws), every policy replayed on it. Each metric is a ratio of
totals; replay and real are compared by a bootstrap over prompts, drawing the same prompts for
both (prompts are independent; within one, paths, seeds and coins are its own noise): the
difference's interval at 95 % with Bonferroni's correction for every comparison made (z for
0.05 / (2 m)), or within 2 % of the real mean. The two wrong replays (the draft after a
rejection rolled out along the path; acceptance read as min(1, p/q)) are run on the same
records and must fail on at least one comparison. Every job's result is a file: rerun to resume.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.harness.models import load_pair
from dspark_bench.measure import sampled_recording
from dspark_bench.replay import sampled
from dspark_bench.replay.simulate import simulate
from dspark_bench.tasks import load_prompts
from dspark_bench.tasks.prompts import encode

TOKENS, SEEDS, GAMMA, PATHS = 128, 5, 6, 4
DOMAINS = ("code", "prose")
SETTINGS = ((0.7, 1.0), (1.0, 1.0), (1.0, 0.9))  # (temperature, top-p)
POLICIES = {
    "fixed γ=2": dict(schedule="fixed", gamma_max=2, min_draft_len=0),
    "fixed γ=4": dict(schedule="fixed", gamma_max=4, min_draft_len=0),
    "fixed γ=6": dict(schedule="fixed", gamma_max=6, min_draft_len=0),
    "top1 0.3 γ≤6": dict(threshold=0.3, gamma_max=6, min_draft_len=0),
    "top1 0.6 γ≤6": dict(threshold=0.6, gamma_max=6, min_draft_len=0),
    "top1 0.6 γ≤6 min2": dict(threshold=0.6, gamma_max=6, min_draft_len=2),
    "entropy 0.5 γ≤6": dict(metric="entropy", threshold=0.5, gamma_max=6, min_draft_len=0),
}
METRICS = {"acceptance_rate": ("accepted", "drafted"), "avg_draft_len": ("drafted", "rounds"),
           "tokens_per_round": ("emitted", "rounds")}
FIELDS = ("rounds", "drafted", "accepted", "emitted")


def config_of(setting, policy: str) -> DecodeConfig:
    return DecodeConfig.of(max_new_tokens=TOKENS, temperature=setting[0], top_p=setting[1], **POLICIES[policy])


def held_out(domain: str) -> list:
    prompts, _, _ = load_prompts(domain, None)
    return prompts[20:40]


def totals(rounds) -> list[int]:
    return [len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds),
            sum(r.emitted for r in rounds)]


def name(setting) -> str:
    return f"T{setting[0]:g}-p{setting[1]:g}"


def real_jobs():
    """Prompt by prompt across every domain and setting: stopped early, every setting has the same
    prompts done (the report compares those)."""
    return [(d, s, i) for i in range(20) for d in DOMAINS for s in SETTINGS]


def run_real(out: Path, part: tuple[int, int]) -> None:
    import torch

    torch.set_num_threads(1)  # one core per part
    pair = load_pair(None, None, "cpu")
    prompts = {d: held_out(d) for d in DOMAINS}
    jobs = [job for n, job in enumerate(real_jobs()) if n % part[1] == part[0] - 1]
    (out / "real").mkdir(parents=True, exist_ok=True)
    for domain, setting, index in jobs:
        path = out / "real" / f"{domain}-{name(setting)}-{index:02d}.json"
        if path.is_file():
            continue
        started = time.perf_counter()
        ids = encode(pair.tokenizer, prompts[domain][index].text, "auto")
        result = {policy: [totals(speculative_decode(pair.target, pair.draft, ids, config_of(setting, policy).replace(
            seed=100 + seed), pair.eos_ids).rounds) for seed in range(SEEDS)] for policy in POLICIES}
        path.write_text(json.dumps(result))
        print(f"{path.name}: {time.perf_counter() - started:.0f} s", flush=True)


def wrong(rec: sampled.SampledRecord, how: str) -> sampled.SampledRecord:
    """A record that the argument says replays wrongly: "path", the draft after a rejection rolled
    out along the path (its tokens and confidences); "ratio", p and q swapped (min(1, p/q))."""
    if how == "ratio":
        return sampled.SampledRecord(rec.paths, rec.lengths, rec.q_token, rec.p_token, rec.rollout, rec.confidences,
                                     rec.eos_ids, rec.info)
    R, N, G = rec.rollout.shape
    at = np.minimum(np.arange(N)[:, None] + np.arange(G)[None, :], N - 1)
    rollout = rec.paths[:, at]
    confidences = {k: v[:, at, 0] for k, v in rec.confidences.items()}
    return sampled.SampledRecord(rec.paths, rec.lengths, rec.p_token, rec.q_token, rollout, confidences, rec.eos_ids,
                                 rec.info)


def per_prompt(rec, config: DecodeConfig, prompts: int) -> np.ndarray:
    """[prompts, 4] totals (rounds, drafted, accepted, emitted) over every path and coin draw."""
    out = np.zeros((prompts, 4))
    for replicate in sampled.replicates(rec):
        for row, rounds in enumerate(simulate(replicate, config)):
            out[row % prompts] += totals(rounds)
    return out


def run_replay(out: Path) -> None:
    pair = load_pair(None, None, "cpu")
    (out / "replay").mkdir(parents=True, exist_ok=True)
    for domain in DOMAINS:
        ids = [encode(pair.tokenizer, p.text, "auto") for p in held_out(domain)]
        for setting in SETTINGS:
            path = out / "replay" / f"{domain}-{name(setting)}.json"
            if path.is_file():
                continue
            started = time.perf_counter()
            rec = sampled_recording.record_sampled(pair, ids, config_of(setting, "fixed γ=6"), GAMMA, PATHS)
            recorded = time.perf_counter() - started
            result = {how or "replay": {policy: per_prompt(wrong(rec, how) if how else rec, config_of(setting, policy),
                                                           len(ids)).tolist() for policy in POLICIES}
                      for how in ("", "path", "ratio")}
            path.write_text(json.dumps({**result, "record_s": recorded, "plain_passes": len(ids) * PATHS}))
            print(f"{path.name}: recorded in {recorded:.0f} s", flush=True)


def compare(real: np.ndarray, replay: np.ndarray, metric: str, rng, draws: int = 4000) -> tuple:
    """Real and replayed ratio of totals, their difference's bootstrap standard error (prompts
    drawn alike for both), and the replay's own 95 % interval over prompts."""
    num, den = (FIELDS.index(f) for f in METRICS[metric])
    point = lambda a, idx: a[idx, num].sum() / a[idx, den].sum()  # noqa: E731
    everyone = np.arange(len(real))
    picks = rng.integers(0, len(real), (draws, len(real)))
    diffs = np.array([point(replay, p) - point(real, p) for p in picks])
    mine = np.array([point(replay, p) for p in picks])
    return point(real, everyone), point(replay, everyone), diffs.std(), np.percentile(mine, [2.5, 97.5])


def report(out: Path) -> None:
    from statistics import NormalDist

    m = len(DOMAINS) * len(SETTINGS) * len(POLICIES) * len(METRICS)
    z = NormalDist().inv_cdf(1 - 0.05 / (2 * m))
    rng = np.random.default_rng(0)
    failures = {"replay": 0, "path": 0, "ratio": 0}
    lines = [f"Bonferroni over m = {m} comparisons: z = {z:.2f}. A comparison passes inside ±z·SE of the "
             "difference (a bootstrap over prompts, the same prompts for both) or within 2 % of the real mean.", "",
             "| domain | T | top-p | policy | metric | real | replay [95 % CI] | diff | ±z·SE | pass | "
             "path-rollout | p/q |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for domain in DOMAINS:
        for setting in SETTINGS:
            stored = json.loads((out / "replay" / f"{domain}-{name(setting)}.json").read_text())
            real_files = {i: out / "real" / f"{domain}-{name(setting)}-{i:02d}.json" for i in range(20)}
            done = [i for i, p in real_files.items() if p.is_file()]  # the prompts both sides have
            real_data = [json.loads(real_files[i].read_text()) for i in done]
            for policy in POLICIES:
                real = np.array([np.sum(r[policy], axis=0) for r in real_data])
                for metric in METRICS:
                    cells = {}
                    for how in ("replay", "path", "ratio"):
                        replay = np.array(stored[how][policy])[done]
                        truth, value, se, ci = compare(real, replay, metric, rng)
                        ok = abs(value - truth) <= z * se or abs(value / truth - 1) <= 0.02
                        failures[how] += not ok
                        cells[how] = (value, ok, se, ci)
                    value, ok, se, ci = cells["replay"]
                    lines.append(f"| {domain} | {setting[0]:g} | {setting[1]:g} | {policy} | {metric} | {truth:.3f} | "
                                 f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | {value - truth:+.3f} | {z * se:.3f} | "
                                 f"{'yes' if ok else '**no**'} | "
                                 f"{cells['path'][0]:.3f}{'' if cells['path'][1] else ' ✗'} | "
                                 f"{cells['ratio'][0]:.3f}{'' if cells['ratio'][1] else ' ✗'} |")
    record_s = [json.loads(p.read_text())["record_s"] for p in sorted((out / "replay").glob("*.json"))]
    prompts = sorted({len([p for p in (out / "real").glob(f"{d}-{name(s)}-*.json")])
                      for d in DOMAINS for s in SETTINGS})
    lines += ["", f"Prompts per domain and setting with real runs: {', '.join(map(str, prompts))} (of 20).",
              f"Comparisons failed: replay {failures['replay']} of {m}; the path-rollout replay "
              f"{failures['path']}; the min(1, p/q) replay {failures['ratio']}.",
              f"Recording: {np.mean(record_s):.0f} s per domain and setting (20 prompts × {PATHS} paths)."]
    (out / "validation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-3:]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--part", default=None, help="real runs: part I/N of the jobs")
    parser.add_argument("--replay", action="store_true")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if args.part:
        index, count = (int(x) for x in args.part.split("/"))
        run_real(args.out, (index, count))
    if args.replay:
        run_replay(args.out)
    if args.report:
        report(args.out)
