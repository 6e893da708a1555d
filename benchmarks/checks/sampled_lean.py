"""Does sampled replay lean low against our real decoder? A paired check on the shipped pair (issue 64, part 3).

    python -m benchmarks.checks.sampled_lean OUT --numerics   # the record's passes vs the decoder's: OUT/numerics.md
    python -m benchmarks.checks.sampled_lean OUT --run        # the paired runs, one file per job (rerun to resume)
    python -m benchmarks.checks.sampled_lean OUT --run --own-seeds --policies "fixed γ=3"   # added after: below
    python -m benchmarks.checks.sampled_lean OUT --report     # the table: OUT/lean.md, OUT/lean.json

Registered before the runs (2026-12-06).
- Numerics: along our decoder's own sampled output (policy top1 0.4 γ≤8 min 1, 48 tokens, 2 seeds,
  3 prompts each of code, prose and short questions/translations, T 0.7 and 1.0), every p and q
  the verifier compared and every confidence the rule read, against the record's one full
  forward; and the record's rollout machinery (recording.draft_rollouts, its tree mask) fed the
  decoder's own drafted tokens after each rejection, against the confidences the decoder read there.
- Paired runs. The decoder's output has the target's law, so a sampled record may be made along
  it as well as along a plain decode's path: replay's law of rounds given the path is the real
  decoder's law given its output (docs/policy-and-metrics.md#replay-under-sampling). Each real
  decode (seeds 100-103) is recorded along its own output (measure/sampled_recording.record_along)
  and its policy replayed there under 16 coin draws; the path's own variation, most of an unpaired
  comparison's noise, cancels. Coins and rollouts take seeds of their own per decode (no two
  decodes share them, unlike sampled_bias.py's records, whose coins were the same for every prompt).
- Grid: code and prose (each task's held-out prompts 20-39) and OOD (below, short questions and
  translations unlike the pair's training text), T 0.3, 0.7, 1.0, top-p 1, 48 new tokens, the five
  policies of sampled_bias.py. Jobs go prompt by prompt across the grid, so a run stopped early
  leaves every cell with the same prompts.
- Report: acceptance, draft length and tokens per round as ratios of totals, replay / real − 1,
  with a 95 % bootstrap over prompts (2,000 draws; each domain's prompts redrawn, the same for both
  sides and every cell of the domain). Powered to see 1 % in acceptance and 3 % in draft length
  per temperature pooled over domains and policies, if the time allows 20 prompts per domain.
Added after the run (what it found): the real seeds 100-103 are every prompt's, and a fixed γ draws
from its generator in the same pattern whatever the prompt (γ draft draws, γ uniforms, one correction
a round), so its real runs share their acceptance uniforms across prompts: noise common to every
prompt, which the bootstrap over prompts does not see. `--own-seeds` seeds each real decode by a
stream of its own (OUT/runs-own); it was run for fixed γ=3, the policy that leaned, on 8 prompts.
`--numerics --policy "fixed γ=3"` repeats the numerics under a fixed γ (every full round's catch-up pass).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.checks.sampled_bias import POLICIES
from dspark_bench.config import DecodeConfig, Drafting

TOKENS, SEEDS, DRAWS, GAMMA, PROMPTS = 48, 4, 16, 8, 20
DOMAINS, TEMPERATURES = ("code", "prose", "ood"), (0.3, 0.7, 1.0)
IN_DOMAIN = ("code", "prose")  # the pair's training text's kind; "ood": short questions and translations
OOD = ["What is the capital of France?", "Translate to German: the cat sleeps.", "Who wrote Hamlet?",
       "Translate to French: good morning, my friend.", "How many legs does a spider have?", "What is 12 times 7?",
       "Translate to Spanish: where is the train station?", "Why is the sky blue?", "Name three primary colours.",
       "Translate to Italian: I would like a coffee, please.", "What is the boiling point of water?",
       "Translate to Dutch: the weather is nice today.", "Who painted the Mona Lisa?", "What is a prime number?",
       "Translate to Portuguese: thank you very much.", "How far is the Moon from the Earth?",
       "What does DNA stand for?", "Translate to German: where is the library?", "Which planet is the largest?",
       "Translate to French: I am learning to cook."]
FIELDS = ("rounds", "drafted", "accepted", "emitted")
METRICS = {"acceptance": ("accepted", "drafted"), "draft length": ("drafted", "rounds"),
           "tokens per round": ("emitted", "rounds")}


def config_of(temperature: float, policy: str, seed: int = 0) -> DecodeConfig:
    return DecodeConfig.of(max_new_tokens=TOKENS, temperature=temperature, seed=seed, **POLICIES[policy])


def jobs() -> list[tuple[str, float, int]]:
    return [(d, t, i) for i in range(PROMPTS) for t in TEMPERATURES for d in DOMAINS]


def job_file(out: Path, domain: str, temperature: float, index: int, folder: str = "runs") -> Path:
    return out / folder / f"{domain}-T{temperature:g}-{index:02d}.json"


def texts(domain: str) -> list[str]:
    from dspark_bench.tasks import load_prompts

    return OOD if domain == "ood" else [p.text for p in load_prompts(domain, None)[0][20:20 + PROMPTS]]


def stream(*key: int) -> int:
    """A seed of its own for each decode's rollouts and coins (SeedSequence spreads every bit)."""
    return int(np.random.SeedSequence([*key, 64]).generate_state(1, np.uint32)[0])


def totals(rounds) -> list[int]:
    return [len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds),
            sum(r.emitted for r in rounds)]


def paired(pair, ids: list[int], temperature: float, policy: str, seed: int, key: tuple[int, ...]) -> dict:
    """One real decode, and its policy replayed along the decode's own output (DRAWS coin draws, averaged)."""
    from dspark_bench.decoding.speculative import speculative_decode
    from dspark_bench.measure.sampled_recording import record_along
    from dspark_bench.replay import sampled
    from dspark_bench.replay.simulate import simulate

    config = config_of(temperature, policy, seed)
    real = speculative_decode(pair.target, pair.draft, ids, config, pair.eos_ids)
    part = record_along(pair, ids, real.tokens, config, GAMMA, 5, stream(*key, 0))
    info = {"sampling": sampled.sampling_of(config, 1, DRAWS)}
    rec = sampled.assemble([part], [ids], TOKENS, GAMMA, 5, pair.eos_ids, Drafting(), info)
    replica, = sampled.replicates(rec, seed=stream(*key, 1))  # one path: one replicate of DRAWS draws
    replay = np.sum([totals(rows) for rows in simulate(replica, config)], axis=0) / DRAWS
    return {"real": totals(real.rounds), "replay": replay.tolist(), "length": len(real.tokens),
            "eos": bool(real.tokens and real.tokens[-1] in pair.eos_ids)}


def run(out: Path, own_seeds: bool = False, policies: list[str] = tuple(POLICIES), seeds: int = SEEDS,
        shard: tuple[int, int] = (0, 1)) -> None:
    """The paired runs; `own_seeds`: each real decode seeded by a stream of its own (OUT/runs-own), not 100-103
    (OUT/runs: the seeds every prompt shared, which a fixed γ's real runs draw from in step across prompts).
    `seeds` decodes per prompt and policy; `shard` (k, n): the k-th of n processes takes every n-th job."""
    import torch

    from dspark_bench.harness.models import load_pair
    from dspark_bench.tasks.prompts import encode

    torch.set_num_threads(1)
    pair = load_pair(None, None, "cpu")
    prompts, folder = {d: texts(d) for d in DOMAINS}, "runs-own" if own_seeds else "runs"
    (out / folder).mkdir(parents=True, exist_ok=True)
    for number, (domain, temperature, index) in enumerate(jobs()):
        path = job_file(out, domain, temperature, index, folder)
        if path.is_file() or number % shard[1] != shard[0]:
            continue
        started, ids = time.perf_counter(), encode(pair.tokenizer, prompts[domain][index], "auto")
        key = (DOMAINS.index(domain), TEMPERATURES.index(temperature), index)
        keys = {p: [(*key, 9 + n, s) if own_seeds else (*key, n, s) for s in range(seeds)]
                for n, p in enumerate(POLICIES) if p in policies}
        result = {p: [paired(pair, ids, temperature, p, stream(*k) if own_seeds else 100 + k[-1], k) for k in ks]
                  for p, ks in keys.items()}
        path.write_text(json.dumps({"decodes": result, "prompt_tokens": len(ids),
                                    "seconds": time.perf_counter() - started}))
        print(f"{path.name}: {time.perf_counter() - started:.0f} s", flush=True)

# --- numerics: the record's passes against the decoder's ------------------------------------------


def decoder_rounds(pair, ids: list[int], config: DecodeConfig):
    """A real decode and, per round, what its verifier compared: p of every block row, q of every
    drafted token, the drafted tokens, the accepted count (speculative.verify, watched)."""
    from dspark_bench.decoding import speculative
    from dspark_bench.decoding.sampling import distribution

    seen, verify = [], speculative.verify

    def watched(logits, block, config, generator):
        accepted, token = verify(logits, block, config, generator)
        q = None if block.probs is None else block.probs.double()  # None: nothing drafted
        seen.append((distribution(logits, config).double(), q, block.tokens.tolist(), int(accepted)))
        return accepted, token

    speculative.verify = watched
    try:
        result = speculative.speculative_decode(pair.target, pair.draft, ids, config, pair.eos_ids)
    finally:
        speculative.verify = verify
    return result, seen


def compare(pair, ids: list[int], config: DecodeConfig, worst: dict) -> None:
    """One decode's p, q and confidences against the record's full forward and rollouts (`worst`: maxima, counts)."""
    import torch

    from dspark_bench.decoding.confidence import score
    from dspark_bench.decoding.sampling import distribution
    from dspark_bench.measure.recording import draft_rollouts

    result, seen = decoder_rounds(pair, ids, config)
    seq = ids + result.tokens
    full = {role: distribution(model(input_ids=torch.tensor([seq])).logits[0], config).double()
            for role, model in (("p", pair.target), ("q", pair.draft))}
    start, after = len(ids), {}  # after: rollout start -> the decoder's draft from the rejected token, its confidences
    for (p_rows, q_rows, tokens, accepted), rnd in zip(seen, result.rounds):
        on_path = [("p", i, p_rows[i]) for i in range(min(accepted, len(tokens)) + 1) if start + i < len(seq)]
        on_path += [("q", i, q_rows[i]) for i in range(min(accepted + 1, len(tokens)))]
        for role, i, row in on_path:
            them = full[role][start + i - 1]
            token = seq[start + i] if role == "p" else tokens[i]
            worst[f"{role}_max_abs"] = max(worst[f"{role}_max_abs"], float((row - them).abs().max()))
            worst[f"{role}_token_rel_over_1e-3"] += abs(float(row[token]) / float(them[token]) - 1) > 1e-3
            worst[f"{role}_rows"] += 1
            if role == "q":
                mine, theirs = rnd.confidences[i], float(score(config, them.float()))
                worst["confidence_max_abs"] = max(worst["confidence_max_abs"], abs(mine - theirs))
                worst["threshold_flips"] += (mine >= config.stopping.threshold) != (theirs >= config.stopping.threshold)
        if accepted < len(tokens):
            after[start - len(ids) + accepted] = (tokens[accepted:], rnd.confidences[accepted:])
        start += rnd.emitted

    def fed(step: int, rows: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        chosen = logits.argmax(dim=-1)
        for r, j in enumerate(rows.tolist()):
            if j in after and step < len(after[j][0]):
                chosen[r] = after[j][0][step]
        return chosen

    _, scores = draft_rollouts(pair.draft, seq, len(ids), len(result.tokens), GAMMA, 5, choose=fed,
                               probs_of=lambda logits: distribution(logits, config))
    for j, (_, confidences) in after.items():
        for k, mine in enumerate(confidences[:GAMMA]):
            worst["rollout_confidence_max_abs"] = max(worst["rollout_confidence_max_abs"],
                                                      abs(mine - float(scores["top1"][j, k])))
            worst["rollout_steps"] += 1


def numerics(out: Path, policy: str = "top1 0.4 γ≤8 min1") -> None:
    import torch

    from dspark_bench.harness.models import load_pair
    from dspark_bench.tasks.prompts import encode

    torch.set_num_threads(1)
    pair, table = load_pair(None, None, "cpu"), {}
    for temperature in (0.7, 1.0):
        for domain in DOMAINS:
            worst = dict.fromkeys(["p_max_abs", "q_max_abs", "confidence_max_abs", "rollout_confidence_max_abs"], 0.0)
            worst.update(dict.fromkeys(["p_token_rel_over_1e-3", "q_token_rel_over_1e-3", "threshold_flips",
                                        "p_rows", "q_rows", "rollout_steps"], 0))
            for text in texts(domain)[:3]:
                for seed in range(2):
                    config = DecodeConfig.of(max_new_tokens=TOKENS, temperature=temperature, seed=seed,
                                             **POLICIES[policy])
                    with torch.inference_mode():
                        compare(pair, encode(pair.tokenizer, text, "auto"), config, worst)
            table[f"{domain} T{temperature:g}"] = worst
            print(domain, temperature, worst, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    name = "numerics" if policy == "top1 0.4 γ≤8 min1" else "numerics-" + policy.split()[0] + policy.split("=")[-1]
    (out / f"{name}.json").write_text(json.dumps(table, indent=1))
    keys = list(next(iter(table.values())))
    lines = ["| cell | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    lines += [f"| {cell} | " + " | ".join(f"{v:.2g}" if isinstance(v, float) else str(v) for v in worst.values())
              + " |" for cell, worst in table.items()]
    (out / f"{name}.md").write_text(f"Policy {policy}.\n\n" + "\n".join(lines) + "\n")



# --- the report ----------------------------------------------------------------------------------


def load(out: Path, folder: str = "runs") -> dict:
    """(domain, T) -> prompt index -> {policy: [decode results]}, for the jobs done."""
    found = {}
    for domain, temperature, index in jobs():
        path = job_file(out, domain, temperature, index, folder)
        if path.is_file():
            found.setdefault((domain, temperature), {})[index] = json.loads(path.read_text())["decodes"]
    return found


def sides(found: dict, domain: str, temperature: float, policies, prompts: list[int]) -> tuple[np.ndarray, ...]:
    """[prompts, 4] totals of the real decodes and of their replays (seeds and policies summed)."""
    done = found[(domain, temperature)]
    real = np.array([[d["real"] for p in policies for d in done[i][p]] for i in prompts], dtype=float).sum(axis=1)
    replay = np.array([[d["replay"] for p in policies for d in done[i][p]] for i in prompts], dtype=float).sum(axis=1)
    return real, replay


def ratio(a: np.ndarray, metric: str) -> float:
    num, den = METRICS[metric]
    return a[..., FIELDS.index(num)].sum() / a[..., FIELDS.index(den)].sum()


def bias(cells: list[tuple[str, np.ndarray, np.ndarray]], metric: str, rng, draws: int = 2000) -> list[float]:
    """replay / real - 1 over `cells` ((domain, real, replay), each [prompts, 4]) and its 95 % bootstrap
    interval: each domain's prompts redrawn, the same draw for both sides and every cell of the domain."""
    def point(picks: dict) -> float:
        real = np.concatenate([c[1][picks[c[0]]] for c in cells])
        replay = np.concatenate([c[2][picks[c[0]]] for c in cells])
        return ratio(replay, metric) / ratio(real, metric) - 1

    sizes = {c[0]: len(c[1]) for c in cells}
    boot = [point({d: rng.integers(0, n, n) for d, n in sizes.items()}) for _ in range(draws)]
    return [point({d: np.arange(n) for d, n in sizes.items()}), *np.percentile(boot, [2.5, 97.5])]


def row(label: str, cells, rng, data: dict) -> str:
    """One table row: the real values and replay/real − 1 [95 %] of every metric over `cells`."""
    real = np.concatenate([c[1] for c in cells])
    found = {m: bias(cells, m, rng) for m in METRICS}
    data[label] = {"decodes": int(real[:, 0].size), **{m: [float(v) for v in b] for m, b in found.items()}}
    shown = " | ".join(f"{ratio(real, m):.3f} | {b[0]:+.1%} [{b[1]:+.1%}, {b[2]:+.1%}]" for m, b in found.items())
    return f"| {label} | {shown} |"


def section(out: Path, folder: str, rng, data: dict) -> list[str]:
    """The table of the paired runs in OUT/`folder`, over the prompts done in every cell, by temperature
    and domain (pooled over the policies run), and by policy (pooled over all)."""
    found = load(out, folder)
    common = sorted(set.intersection(*(set(found.get((d, t), {})) for d in DOMAINS for t in TEMPERATURES)))
    if not common:
        return [f"No prompt of {folder} is done in every cell yet."]
    policies = list(found[(DOMAINS[0], TEMPERATURES[0])][common[0]])
    seeds = "a seed of its own" if folder == "runs-own" else "seeds 100-103, the same for every prompt"
    per_prompt = len(found[(DOMAINS[0], TEMPERATURES[0])][common[0]][policies[0]])
    head = " | ".join(f"{m} real | replay/real − 1 [95 %]" for m in METRICS)
    said = (f"Each real decode ({seeds}) against its policy replayed along its own output ({DRAWS} coin draws); "
            f"{len(common)} prompts per domain and temperature, {per_prompt} decodes per prompt and policy, "
            f"{TOKENS} tokens, top-p 1.")
    lines = [f"### {folder}: {', '.join(policies)}", "", said, "", f"| cell | {head} |", "|---" * 7 + "|"]
    data = data.setdefault(folder, {})

    def cells(domains, temperatures, chosen=tuple(policies)):
        return [(d, *sides(found, d, t, chosen, common)) for d in domains for t in temperatures]

    for t in TEMPERATURES:
        lines.append(row(f"T {t:g}, pooled", cells(DOMAINS, [t]), rng, data))
        lines.append(row(f"T {t:g}, in domain (code, prose)", cells(IN_DOMAIN, [t]), rng, data))
        lines += [row(f"T {t:g}, {d}", cells([d], [t]), rng, data) for d in DOMAINS]
    lines.append(row("all", cells(DOMAINS, TEMPERATURES), rng, data))
    lines.append(row("all, in domain (code, prose)", cells(IN_DOMAIN, TEMPERATURES), rng, data))
    lines.append(row("all, ood", cells(["ood"], TEMPERATURES), rng, data))
    if len(policies) > 1:
        lines += [row(f"{p} (all T, domains)", cells(DOMAINS, TEMPERATURES, [p]), rng, data) for p in policies]
    decodes = [x for v in found.values() for i in common for runs in v[i].values() for x in runs]
    data["decodes"], data["eos"] = len(decodes), sum(x["eos"] for x in decodes)
    return lines + ["", f"{len(decodes)} decodes; {data['eos']} ended at EOS, the rest at {TOKENS} tokens.", ""]


def report(out: Path) -> None:
    rng, data, lines = np.random.default_rng(0), {}, []
    for folder in ("runs", "runs-own"):
        if (out / folder).is_dir():
            lines += section(out, folder, rng, data)
    (out / "lean.md").write_text("\n".join(lines))
    (out / "lean.json").write_text(json.dumps(data, indent=1))
    print("\n".join(lines))

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--numerics", action="store_true")
    parser.add_argument("--policy", default="top1 0.4 γ≤8 min1", choices=list(POLICIES), help="--numerics' policy")
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--own-seeds", action="store_true", help="--run with a real seed of its own per decode")
    parser.add_argument("--policies", default=",".join(POLICIES), help="--run's policies, comma-separated")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="--run's decodes per prompt and policy")
    parser.add_argument("--shard", default="0/1", help="--run's share K/N: every N-th job from the K-th")
    args = parser.parse_args()
    if args.numerics:
        numerics(args.out, args.policy)
    if args.run:
        run(args.out, args.own_seeds, args.policies.split(","), args.seeds, tuple(map(int, args.shard.split("/"))))
    if args.report:
        report(args.out)
