"""Replay under sampling on the shipped pair, by temperature: its bias and what K paths buy (issue 55).

    python -m benchmarks.checks.sampled_bias OUT --part 1/2 &   # half the prompts (one core each)
    python -m benchmarks.checks.sampled_bias OUT --part 2/2 &   # the other half
    python -m benchmarks.checks.sampled_bias OUT --report       # the tables: OUT/bias.md, OUT/bias.json

Registered before the runs. The shipped pair, 20 held-out prompts of code and of prose (each
task's prompts 20-39: sweeps take the first 10), 48 new tokens, T in {0.3, 0.7, 1.0}, top-p 1,
five policies (fixed γ 3 and 6, top1 0.4 γ≤8 min 1, top1 0.6 γ≤6, entropy 0.6 γ≤4). T = 0.5 is
left to the tiny pair and the exact sums (benchmarks/checks/sampled_tiny.py): on 2 cores the 120 jobs
here take about an hour, a fourth temperature 20 minutes more.
- Real: our decoder's speculative sampling, 10 seeds per prompt and policy (seeds 100-109).
- Replay: per prompt, one sampled record of K = 16 paths (replay/sampled.py, path seeds 0-15),
  every policy replayed on it under the record's 4 coin draws per path.
- Bias: tokens per round (and acceptance) replayed over real, minus 1, each a ratio of totals over
  the prompts; its 95 % interval a bootstrap over prompts, the same prompts drawn for both sides,
  so that it holds the real runs' own noise (their seeds) beside replay's (its paths and coins).
  Per temperature, pooled over domains and policies (one draw of prompts per domain, shared by
  its policies, which share prompts, paths and seeds); and per domain and policy.
- Coverage: how often the real value falls inside replay's own interval (Student's t over the K
  replicates, as a sweep reports it) and inside the interval of the difference.
- What K buys: replay's 95 % half-width on tokens per round with the first K of the 16 paths
  (K = 2, 4, 8, 16), and the recording's seconds per path, against a greedy record's per prompt.
Every prompt's result is a file (OUT/<domain>-T<t>-<i>.json): rerun to resume.
Found after (benchmarks/checks/sampled_lean.py): every prompt's real runs use the same seeds and
every prompt's record the same path seeds and coins (one record per prompt, coin seed 0), so part
of each side's noise is common to all prompts and the bootstrap over prompts does not hold it; a
fixed γ's real runs draw in step across prompts. Kept as run, so that the stored runs reproduce.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.checks.sampled_replay import FIELDS, totals
from dspark_bench.config import DecodeConfig
from dspark_bench.measure import sampled_recording
from dspark_bench.paired import t_quantile
from dspark_bench.replay import sampled

TOKENS, SEEDS, PATHS, GAMMA, PROMPTS = 48, 10, 16, 8, 20
DOMAINS, TEMPERATURES = ("code", "prose"), (0.3, 0.7, 1.0)
POLICIES = {
    "fixed γ=3": dict(schedule="fixed", gamma_max=3, min_draft_len=0),
    "fixed γ=6": dict(schedule="fixed", gamma_max=6, min_draft_len=0),
    "top1 0.4 γ≤8 min1": dict(threshold=0.4, gamma_max=8, min_draft_len=1),
    "top1 0.6 γ≤6": dict(threshold=0.6, gamma_max=6, min_draft_len=0),
    "entropy 0.6 γ≤4": dict(metric="entropy", threshold=0.6, gamma_max=4, min_draft_len=0),
}
KS = (2, 4, 8, 16)


def config_of(temperature: float, policy: str) -> DecodeConfig:
    return DecodeConfig.of(max_new_tokens=TOKENS, temperature=temperature, **POLICIES[policy])


def jobs() -> list[tuple[str, float, int]]:
    return [(d, t, i) for i in range(PROMPTS) for d in DOMAINS for t in TEMPERATURES]


def job_file(out: Path, domain: str, temperature: float, index: int) -> Path:
    return out / f"{domain}-T{temperature:g}-{index:02d}.json"


def run(out: Path, part: tuple[int, int]) -> None:
    import torch

    from dspark_bench.decoding.speculative import speculative_decode
    from dspark_bench.harness.models import load_pair
    from dspark_bench.measure.recording import record
    from dspark_bench.replay.simulate import simulate
    from dspark_bench.tasks import load_prompts
    from dspark_bench.tasks.prompts import encode

    torch.set_num_threads(1)  # one core per part
    out.mkdir(parents=True, exist_ok=True)
    pair = load_pair(None, None, "cpu")
    prompts = {d: load_prompts(d, None)[0][20:20 + PROMPTS] for d in DOMAINS}
    for n, (domain, temperature, index) in enumerate(jobs()):
        path = job_file(out, domain, temperature, index)
        if n % part[1] != part[0] - 1 or path.is_file():
            continue
        ids = encode(pair.tokenizer, prompts[domain][index].text, "auto")
        started = time.perf_counter()
        real = {policy: [totals(speculative_decode(pair.target, pair.draft, ids, config_of(temperature, policy)
                                                   .replace(seed=100 + s), pair.eos_ids).rounds) for s in range(SEEDS)]
                for policy in POLICIES}
        decoded = time.perf_counter()
        rec = sampled_recording.record_sampled(pair, [ids], config_of(temperature, "fixed γ=6"), GAMMA, paths=PATHS)
        recorded = time.perf_counter()
        record(pair, [ids], TOKENS, GAMMA, eos_ids=pair.eos_ids)  # a greedy record of the prompt, for its cost
        greedy_s = time.perf_counter() - recorded
        # Per path, its coin draws' totals summed: replicates(rec)[k] is path k under every draw.
        replay = {policy: [np.sum([totals(rows) for rows in simulate(replicate, config_of(temperature, policy))],
                                  axis=0).tolist() for replicate in sampled.replicates(rec)] for policy in POLICIES}
        path.write_text(json.dumps({"real": real, "replay": replay, "draws": rec.info["sampling"]["draws"],
                                    "prompt_tokens": len(ids), "real_s": decoded - started,
                                    "record_s": recorded - decoded, "greedy_record_s": greedy_s}))
        print(f"{path.name}: {time.perf_counter() - started:.0f} s", flush=True)


# --- the report ----------------------------------------------------------------------------------


def load(out: Path) -> dict:
    """(domain, T) -> prompt index -> that prompt's stored result, for the prompts done."""
    found = {}
    for domain, temperature, index in jobs():
        path = job_file(out, domain, temperature, index)
        if path.is_file():
            found.setdefault((domain, temperature), {})[index] = json.loads(path.read_text())
    return found


def ratio(a: np.ndarray, metric: str) -> float:
    """A metric of summed totals [..., 4]: tokens per round or acceptance."""
    num, den = ("emitted", "rounds") if metric == "tokens_per_round" else ("accepted", "drafted")
    return a[..., FIELDS.index(num)].sum() / a[..., FIELDS.index(den)].sum()


def sides(found: dict, domain: str, temperature: float, policy: str, prompts: list[int]):
    """[prompts, 4] real totals (its seeds summed) and replay's (its paths and draws summed, per draw)."""
    done = found[(domain, temperature)]
    real = np.array([np.sum(done[i]["real"][policy], axis=0) for i in prompts], dtype=float)
    replay = np.array([np.sum(done[i]["replay"][policy], axis=0) / (PATHS * done[i]["draws"]) * SEEDS
                       for i in prompts], dtype=float)  # on the real side's scale: SEEDS decodes per prompt
    return real, replay


def bias(cells: list[tuple[str, np.ndarray, np.ndarray]], metric: str, rng, draws: int = 2000) -> list[float]:
    """replay / real - 1 of totals pooled over `cells` ((domain, real, replay), each side [prompts, 4]),
    with a 95 % bootstrap interval: each domain's prompts redrawn, one draw for both sides and for
    every cell of the domain."""
    def point(picks: dict) -> float:
        real = np.concatenate([c[1][picks[c[0]]] for c in cells])
        replay = np.concatenate([c[2][picks[c[0]]] for c in cells])
        return ratio(replay, metric) / ratio(real, metric) - 1

    sizes = {c[0]: len(c[1]) for c in cells}
    everyone = {domain: np.arange(n) for domain, n in sizes.items()}
    boot = [point({domain: rng.integers(0, n, n) for domain, n in sizes.items()}) for _ in range(draws)]
    return [point(everyone), *np.percentile(boot, [2.5, 97.5])]


def replay_interval(found: dict, domain: str, temperature: float, policy: str, prompts: list[int], k: int,
                    metric: str = "tokens_per_round") -> tuple[float, float]:
    """Replay's own estimate and 95 % half-width from the first k paths, as a sweep computes it:
    replicate j pools path j of every prompt; Student's t over the k replicates."""
    done = found[(domain, temperature)]
    paths = np.array([done[i]["replay"][policy][:k] for i in prompts], dtype=float)  # [prompts, k, 4]
    per = np.array([ratio(paths[:, j], metric) for j in range(k)])
    return ratio(paths, metric), t_quantile(k - 1) * per.std(ddof=1) / np.sqrt(k)


def report(out: Path) -> None:
    rng, found, lines, data = np.random.default_rng(0), load(out), [], {}
    common = {t: sorted(set.intersection(*(set(found.get((d, t), {})) for d in DOMAINS))) for t in TEMPERATURES}
    temperatures = [t for t in TEMPERATURES if common[t]]
    lines += ["## Bias by temperature (pooled over both domains and the five policies)", "",
              "| T | prompts per domain | tokens/round real | replay | replay/real − 1 [95 %] | acceptance "
              "replay/real − 1 [95 %] |", "|---|---|---|---|---|---|"]
    for t in temperatures:
        cells = [(d, *sides(found, d, t, p, common[t])) for d in DOMAINS for p in POLICIES]
        tpr, acc = bias(cells, "tokens_per_round", rng), bias(cells, "acceptance", rng)
        real = ratio(np.concatenate([c[1] for c in cells]), "tokens_per_round")
        rep = ratio(np.concatenate([c[2] for c in cells]), "tokens_per_round")
        data[f"T{t:g}"] = {"prompts": len(common[t]), "tokens_per_round_bias": tpr, "acceptance_bias": acc}
        lines.append(f"| {t:g} | {len(common[t])} | {real:.3f} | {rep:.3f} | {tpr[0]:+.1%} [{tpr[1]:+.1%}, "
                     f"{tpr[2]:+.1%}] | {acc[0]:+.1%} [{acc[1]:+.1%}, {acc[2]:+.1%}] |")
    lines += ["", "## By domain and policy: tokens per round", "",
              "| T | domain | policy | real | replay ± its own 95 % (K = 16) | replay/real − 1 [95 %, with the real "
              "runs' noise] | real inside replay's own | inside the difference's |", "|---" * 8 + "|"]
    inside_own = inside_diff = cells_seen = 0
    for t in temperatures:
        for d in DOMAINS:
            for p in POLICIES:
                real, replay = sides(found, d, t, p, common[t])
                value, half = replay_interval(found, d, t, p, common[t], PATHS)
                b = bias([(d, real, replay)], "tokens_per_round", rng)
                truth = ratio(real, "tokens_per_round")
                own, diff = abs(value - truth) <= half, b[1] <= 0 <= b[2]
                inside_own, inside_diff, cells_seen = inside_own + own, inside_diff + diff, cells_seen + 1
                lines.append(f"| {t:g} | {d} | {p} | {truth:.3f} | {value:.3f} ± {half:.3f} | {b[0]:+.1%} "
                             f"[{b[1]:+.1%}, {b[2]:+.1%}] | {'yes' if own else 'no'} | {'yes' if diff else 'no'} |")
    lines += ["", f"The real value inside replay's own interval: {inside_own} of {cells_seen}; zero inside the "
              f"difference's interval: {inside_diff} of {cells_seen}."]
    data["coverage"] = {"cells": cells_seen, "inside_replay_interval": inside_own, "inside_difference": inside_diff}
    lines += ["", "## What K paths buy", "", "| K | replay's 95 % half-width on tokens per round, median over cells "
              "(relative) | largest | recording seconds per prompt |", "|---|---|---|---|"]
    per_path = np.median([r["record_s"] / PATHS for v in found.values() for r in v.values()])
    greedy = np.median([r["greedy_record_s"] for v in found.values() for r in v.values()])
    data["precision"] = {}
    for k in KS:
        widths = [half / value for t in temperatures for d in DOMAINS for p in POLICIES
                  for value, half in [replay_interval(found, d, t, p, common[t], k)]]
        data["precision"][k] = {"median": float(np.median(widths)), "max": float(np.max(widths)),
                                "record_s_per_prompt": float(per_path * k)}
        lines.append(f"| {k} | ±{np.median(widths):.1%} | ±{np.max(widths):.1%} | {per_path * k:.1f} |")
    lines += ["", f"A greedy record costs {greedy:.1f} s per prompt; a sampled one {per_path:.1f} s per path "
              f"(median over the {sum(len(v) for v in found.values())} prompt records; both at {TOKENS} tokens)."]
    data["record_s_per_path"], data["greedy_record_s"] = float(per_path), float(greedy)
    (out / "bias.md").write_text("\n".join(lines) + "\n")
    (out / "bias.json").write_text(json.dumps(data, indent=1, default=float))
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--part", default=None, help="run part I/N of the prompts")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if args.part:
        run(args.out, tuple(int(x) for x in args.part.split("/")))
    if args.report:
        report(args.out)
