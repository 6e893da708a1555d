"""Replay under sampling on the tiny pair, by temperature: issue 55's pre-registered validation.

    python -m benchmarks.checks.sampled_tiny OUT --part 1/2 &   # half the settings (one core each)
    python -m benchmarks.checks.sampled_tiny OUT --part 2/2 &   # the other half
    python -m benchmarks.checks.sampled_tiny OUT --report       # the table: OUT/tiny.md, OUT/tiny.json
    python -m benchmarks.checks.sampled_tiny OUT --exact        # against exact sums: OUT/exact.md, OUT/exact.json

Registered before the runs. The tests' tiny Llama pair (tests/tiny.py: a random target and a
noisy copy as the draft), the prompt [7, 21, 33, 2], 16 new tokens, at 16 cells: T in {0.3, 0.5,
0.7, 1.0} x top-p in {1.0, 0.9} x policy in {fixed γ=4, top1 0.3 γ≤4}.
- Real: our decoder's speculative sampling, one decode per seed (100000 + s, s < SEEDS).
- Replay: per (T, top-p), one sampled record of SEEDS paths (replay/sampled.py, path seeds 0 ...,
  disjoint from the real seeds), each path replayed under its own first coin draw, so that a
  replayed sequence and a real one are the same kind of unit (one independent decode each).
- The test: the joint law of (drafted, accepted) per round, a chi-square statistic of the
  2 x cells table of round counts, its p-value from a permutation of the *sequences* between
  the two sides (rounds within a decode are not independent, so the textbook chi-square p-value
  is too small; shuffling whole sequences is exact under the null). 4,000 permutations.
- The verdict: a cell rejects at 0.05 / 16 (Bonferroni over the cells). Replay is called biased
  at a temperature if any of its cells rejects. Beside it, acceptance and tokens per round real
  against replayed, with a 95 % bootstrap interval over sequences of replay / real - 1.
Every setting's result is a file (OUT/tiny-*.npz): rerun to resume.

--exact holds each side to the truth alone. The 3-token Markov pair of
tests/test_sampled_replay.py as two real Llamas (tests/tiny.markov_llama), 5 new tokens from the
token 0, at 8 settings (the same temperatures; top-p 1 and 0.88, since 0.9 ties the pair's nucleus
edges at T = 1, where float32 and float64 keep different tokens) x policy in {fixed γ=3, top1 0.8
γ≤3}: the decoder's mean rounds, drafted and accepted tokens per sequence over EXACT_RUNS seeds,
and replay's over a record of EXACT_RUNS paths (4 coin draws each; its standard error over paths),
each against the exact sums of the tempered matrices (test_sampled_replay.Exact). A side is off
where |z| > 3.5 (0.05 over 96 comparisons).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from dspark_bench.config import DecodeConfig
from dspark_bench.measure import sampled_recording
from dspark_bench.replay import sampled

SEEDS, TOKENS, GAMMA, PROMPT = 2000, 16, 4, [7, 21, 33, 2]
TEMPERATURES, TOP_PS = (0.3, 0.5, 0.7, 1.0), (1.0, 0.9)
POLICIES = {"fixed γ=4": dict(schedule="fixed", gamma_max=GAMMA, min_draft_len=0),
            "top1 0.3 γ≤4": dict(threshold=0.3, gamma_max=GAMMA)}
PERMUTATIONS, ALPHA = 4000, 0.05
EXACT_RUNS, EXACT_Z, EXACT_TOP_PS = 2000, 3.5, (1.0, 0.88)
EXACT_POLICIES = {"fixed γ=3": dict(schedule="fixed", gamma_max=3, min_draft_len=0),
                  "top1 0.8 γ≤3": dict(threshold=0.8, gamma_max=3, min_draft_len=0)}
CELLS = len(TEMPERATURES) * len(TOP_PS) * len(POLICIES)


def settings() -> list[tuple[float, float]]:
    return [(t, p) for t in TEMPERATURES for p in TOP_PS]


def name(setting) -> str:
    return f"T{setting[0]:g}-p{setting[1]:g}"


def config_of(setting, policy: str) -> DecodeConfig:
    return DecodeConfig.of(max_new_tokens=TOKENS, temperature=setting[0], top_p=setting[1], **POLICIES[policy])


def counts(rounds) -> np.ndarray:
    """One sequence's rounds as counts of (drafted, accepted), flattened [(γ + 1)²]."""
    out = np.zeros((GAMMA + 1, GAMMA + 1))
    for r in rounds:
        out[r.drafted, r.accepted] += 1
    return out.ravel()


def tiny_pair(folder: Path):
    from dspark_bench.harness.models import load_pair
    from tests import tiny  # the tests' pair builder, loaded (with transformers) by the runs alone

    target = tiny.llama()
    return load_pair(*tiny.save_pair(folder / "pair", target, tiny.noisy_copy(target, 0.03)), device="cpu")


def run(out: Path, part: tuple[int, int]) -> None:
    import torch

    from dspark_bench.decoding.speculative import speculative_decode
    from dspark_bench.replay.simulate import simulate

    torch.set_num_threads(1)  # one core per part
    out.mkdir(parents=True, exist_ok=True)
    pair = tiny_pair(out / f"part{part[0]}")
    for n, setting in enumerate(settings()):
        path = out / f"tiny-{name(setting)}.npz"
        if n % part[1] != part[0] - 1 or path.is_file():
            continue
        started, arrays = time.perf_counter(), {}
        rec = sampled_recording.record_sampled(pair, [PROMPT], config_of(setting, "fixed γ=4"), GAMMA, paths=SEEDS,
                                               eos_ids=frozenset())
        for policy in POLICIES:
            config = config_of(setting, policy)
            arrays[f"real {policy}"] = np.stack([counts(speculative_decode(
                pair.target, pair.draft, PROMPT, config.replace(seed=100_000 + s)).rounds) for s in range(SEEDS)])
            # Each replicate is one path under the record's coin draws, stacked: its row 0 is the first draw.
            arrays[f"replay {policy}"] = np.stack([counts(simulate(replicate, config)[0])
                                                   for replicate in sampled.replicates(rec)])
        np.savez(path, **arrays)
        print(f"{path.name}: {time.perf_counter() - started:.0f} s", flush=True)


def chi_square(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The homogeneity statistic of tables whose rows are a [..., cells] and b [..., cells]."""
    table = np.stack([a, b], axis=-2)  # [..., 2, cells]
    expected = table.sum(-1, keepdims=True) * table.sum(-2, keepdims=True) / table.sum((-1, -2), keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(expected > 0, (table - expected) ** 2 / expected, 0.0).sum((-1, -2))


def permutation_p(real: np.ndarray, replay: np.ndarray, rng, permutations: int = PERMUTATIONS) -> float:
    """P(statistic >= observed) when whole sequences are shuffled between the two sides."""
    both, n = np.concatenate([real, replay]), len(real)
    observed = chi_square(real.sum(0), replay.sum(0))
    total, beyond = both.sum(0), 0
    for start in range(0, permutations, 500):
        k = min(500, permutations - start)
        first = np.argsort(rng.random((k, len(both))), axis=1)[:, :n]  # each row: n sequences drawn for side one
        picked = np.zeros((k, len(both)))
        np.put_along_axis(picked, first, 1.0, axis=1)
        side = picked @ both
        beyond += int((chi_square(side, total - side) >= observed - 1e-9).sum())
    return (1 + beyond) / (1 + permutations)


def rates(c: np.ndarray) -> tuple[float, float]:
    """(acceptance, tokens per round) of summed (drafted, accepted) counts [cells]."""
    grid = c.reshape(GAMMA + 1, GAMMA + 1)
    drafted, accepted = np.arange(GAMMA + 1)[:, None], np.arange(GAMMA + 1)[None, :]
    rounds = grid.sum()
    # A round emits its accepted tokens and one more (16 tokens, no EOS: the last round may emit fewer,
    # the same on both sides: its cap is the tokens left).
    return (grid * accepted).sum() / max((grid * drafted).sum(), 1), (grid * (accepted + 1)).sum() / rounds


def bias_interval(real: np.ndarray, replay: np.ndarray, rng, draws: int = 2000) -> np.ndarray:
    """[2, 3]: per metric (acceptance, tokens per round) replay / real - 1 and its 95 % bootstrap
    interval, sequences resampled on each side."""
    point = np.array(rates(replay.sum(0))) / np.array(rates(real.sum(0))) - 1
    boot = np.array([np.array(rates(replay[rng.integers(0, len(replay), len(replay))].sum(0)))
                     / np.array(rates(real[rng.integers(0, len(real), len(real))].sum(0))) - 1 for _ in range(draws)])
    low, high = np.percentile(boot, [2.5, 97.5], axis=0)
    return np.stack([point, low, high], axis=1)


def report(out: Path) -> None:
    rng, rows, limit = np.random.default_rng(0), [], ALPHA / CELLS
    for setting in settings():
        path = out / f"tiny-{name(setting)}.npz"
        if not path.is_file():
            continue
        arrays = np.load(path)
        for policy in POLICIES:
            real, replay = arrays[f"real {policy}"], arrays[f"replay {policy}"]
            bias = bias_interval(real, replay, rng)
            rows.append({"temperature": setting[0], "top_p": setting[1], "policy": policy, "sequences": len(real),
                         "p": permutation_p(real, replay, rng), "acceptance_real": rates(real.sum(0))[0],
                         "acceptance_replay": rates(replay.sum(0))[0], "tpr_real": rates(real.sum(0))[1],
                         "tpr_replay": rates(replay.sum(0))[1], "acceptance_bias": bias[0].tolist(),
                         "tpr_bias": bias[1].tolist()})
    lines = [f"{len(rows)} of {CELLS} cells; a cell rejects at p < {limit:.4f} (0.05 / {CELLS}).", "",
             "| T | top-p | policy | sequences | p (permutation) | acceptance real | replay | replay/real − 1 "
             "[95 %] | tokens/round real | replay | replay/real − 1 [95 %] |", "|---" * 11 + "|"]
    for r in rows:
        a, t = r["acceptance_bias"], r["tpr_bias"]
        flag = " **rejects**" if r["p"] < limit else ""
        lines.append(f"| {r['temperature']:g} | {r['top_p']:g} | {r['policy']} | {r['sequences']} | {r['p']:.3f}{flag} "
                     f"| {r['acceptance_real']:.4f} | {r['acceptance_replay']:.4f} | {a[0]:+.1%} [{a[1]:+.1%}, "
                     f"{a[2]:+.1%}] | {r['tpr_real']:.3f} | {r['tpr_replay']:.3f} | {t[0]:+.1%} [{t[1]:+.1%}, "
                     f"{t[2]:+.1%}] |")
    biased = sorted({r["temperature"] for r in rows if r["p"] < limit})
    lines += ["", "Biased at: " + (", ".join(f"T = {t:g}" for t in biased) if biased else "no temperature") + "."]
    (out / "tiny.md").write_text("\n".join(lines) + "\n")
    (out / "tiny.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))


def exact(out: Path) -> None:
    from types import SimpleNamespace

    import torch

    from dspark_bench.decoding.speculative import speculative_decode
    from dspark_bench.replay.simulate import simulate
    from tests import tiny  # the tests' Markov pair and exact sums, loaded by this part alone
    from tests.test_sampled_replay import Exact, N, P, Q, tempered

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    models = SimpleNamespace(target=tiny.markov_llama(P), draft=tiny.markov_llama(Q), eos_ids=frozenset())

    def sums(rounds) -> list[int]:
        return [len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds)]

    def z_of(sample: np.ndarray, truth: np.ndarray) -> np.ndarray:
        """Standard errors from the truth; a sample without spread (a cell where the tempered pair
        is deterministic) is 0 where it equals the truth, else infinitely far."""
        error = sample.std(0, ddof=1) / np.sqrt(len(sample))
        off = sample.mean(0) - truth
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(error > 0, off / error, np.where(np.isclose(off, 0, atol=1e-9), 0.0, np.inf))

    rows, lines = [], ["| T | top-p | policy | metric | exact | decoder (z) | replay (z) |", "|---" * 7 + "|"]
    for setting in [(t, p) for t in TEMPERATURES for p in EXACT_TOP_PS]:
        for policy, knobs in EXACT_POLICIES.items():
            truth = Exact(tempered(P, *setting), tempered(Q, *setting))(knobs)
            config = DecodeConfig.of(max_new_tokens=N, temperature=setting[0], top_p=setting[1], **knobs)
            real = np.array([sums(speculative_decode(models.target, models.draft, [0], config.replace(
                seed=100_000 + s)).rounds) for s in range(EXACT_RUNS)], dtype=float)
            rec = sampled_recording.record_sampled(models, [[0]], config, knobs["gamma_max"], EXACT_RUNS,
                                                   eos_ids=frozenset())
            replay = np.array([np.mean([sums(draw) for draw in simulate(replicate, config)], axis=0)
                               for replicate in sampled.replicates(rec)])  # per path, its draws averaged
            z = {"decoder": z_of(real, truth), "replay": z_of(replay, truth)}
            for m, metric in enumerate(("rounds", "drafted", "accepted")):
                rows.append({"temperature": setting[0], "top_p": setting[1], "policy": policy, "metric": metric,
                             "exact": truth[m], "decoder": real[:, m].mean(), "decoder_z": z["decoder"][m],
                             "replay": replay[:, m].mean(), "replay_z": z["replay"][m]})
                lines.append(f"| {setting[0]:g} | {setting[1]:g} | {policy} | {metric} | {truth[m]:.4f} | "
                             f"{real[:, m].mean():.4f} ({z['decoder'][m]:+.1f}) | {replay[:, m].mean():.4f} "
                             f"({z['replay'][m]:+.1f}) |")
            print("\n".join(lines[-3:]), flush=True)
    off = [r for r in rows for side in ("decoder", "replay") if abs(r[f"{side}_z"]) > EXACT_Z]
    worst = max(abs(r["replay"] / r["exact"] - 1) for r in rows if r["exact"] > 0)
    lines += ["", f"{EXACT_RUNS} decodes and {EXACT_RUNS} replayed paths per cell; off (|z| > {EXACT_Z}): "
              f"{len(off)} of {2 * len(rows)}; replay's largest |replay / exact - 1|: {worst:.2%}."]
    (out / "exact.md").write_text("\n".join(lines) + "\n")
    (out / "exact.json").write_text(json.dumps(rows, indent=1, default=float))
    print(lines[-1])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--part", default=None, help="run part I/N of the settings")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--exact", action="store_true", help="the Markov pair against exact sums")
    parser.add_argument("--seeds", type=int, default=SEEDS, help=f"decodes per side and cell (default {SEEDS})")
    args = parser.parse_args()
    SEEDS = args.seeds
    if args.part:
        run(args.out, tuple(int(x) for x in args.part.split("/")))
    if args.report:
        report(args.out)
    if args.exact:
        exact(args.out)
