"""The engines' controllers held to the engines' code and to our decoder on the shipped pair (issue 65).

    python -m benchmarks.checks.controllers OUT [--limit 10] [--tokens 128] [--goodput-model SWEEP]

Writes OUT/controllers.md and OUT/controllers.json:
- SGLang: the same accepted counts to SGLang's own AdaptiveStepSlot (sglang 0.5.23, imported) and to
  ours, step by step: random sequences (24 settings, SGLang's four shipped slots among them, 1,000
  steps each) and recorded ones (a replay of the shipped pair's record under each setting, SGLang's
  slot fed every round's accepted count, its pick held against the round's length); every step counted.
- Replay against our decoder on the shipped pair: each controller policy (SGLang's shipped slots for
  B = 1 and 8, three tuned-looking settings, TensorRT-LLM's schedule with and without its gate) at
  batch 1, the decoder running one controller on across the prompts as a run does: rounds compared
  and rounds that differ; every output against the target's own; at B = 8 the batched server's
  rounds, drafts and acceptances against replay's walk of the same server.
- vLLM's adaptive verification (with --goodput-model, a sweep's step costs): at batch 1 and B = 8 as
  above, at K = 4 with and without a per-batch-size table; how many rounds it trimmed.
TensorRT-LLM and vLLM do not import on a CPU: their vectors are tests/test_controllers.py's and
tests/test_adaptive_verification.py's (vLLM's computed by its own code, docs/engine-controllers.md).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
from sglang.srt.speculative import adaptive_spec_params as sglang  # SGLang's own controller

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import controllers
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.batched import batched_speculative
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.harness.models import load_pair
from dspark_bench.measure.recording import record
from dspark_bench.replay.joint_walks import walk_controlled
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.replay.simulate import simulate
from dspark_bench.replay.slots import unpriced
from dspark_bench.replay.step_prices import StepPrices
from dspark_bench.tasks import load_prompts
from dspark_bench.tasks.prompts import encode

G = 8


def settings(count: int, seed: int) -> list[dict]:
    shipped = [{**e, "candidate_steps": list(e["candidate_steps"])} for e in sglang.DEFAULT_ADAPTIVE_CONFIG.values()]
    rng = random.Random(seed)
    return shipped + [{"candidate_steps": sorted(rng.sample(range(0, G + 1), rng.randint(1, 5))),
                       "ema_alpha": rng.choice([0.05, 0.2, 0.5, 1.0]), "update_interval": rng.randint(1, 6),
                       "warmup_batches": rng.randint(0, 12), "up_hysteresis": rng.choice([0.0, 0.25, -0.3]),
                       "down_hysteresis": rng.choice([0.0, -0.25, 0.3]), "ceiling_coeff": rng.choice([0, 1.0, 1.5])}
                      for _ in range(count)]


def policy(setting: dict, **knobs) -> DecodeConfig:
    return DecodeConfig.of(schedule="sglang-adaptive", **{**setting, "candidate_steps": ",".join(
        map(str, setting["candidate_steps"]))}, **knobs)


def slot(setting: dict):
    steps = sorted(set(setting["candidate_steps"]))
    return sglang.AdaptiveStepSlot(steps[len(steps) // 2], setting)


def against_sglang(rec, tokens: int) -> dict:
    rng, out = random.Random(1), {"random": [0, 0], "recorded": [0, 0]}
    for setting in settings(20, 0):
        ours, theirs = controllers.start(policy(setting)), slot(setting)
        for _ in range(1000):
            k = ours.steps()
            out["random"][0] += 1
            out["random"][1] += k == theirs.current_steps
            accepted = [rng.randint(0, k) for _ in range(rng.randint(1, 32))]
            ours.observe(accepted, [k] * len(accepted))
            theirs.update(accepted)
        theirs = slot(setting)
        for rounds in simulate(rec, policy(setting, max_new_tokens=tokens)):
            j = 0
            for r in rounds:
                out["recorded"][0] += 1
                out["recorded"][1] += r.drafted == min(theirs.current_steps, tokens - j - 1)
                theirs.update([r.accepted])
                j += r.emitted
    return {kind: {"steps": n, "same": same} for kind, (n, same) in out.items()}


def checked_policies(tokens: int, goodput_model: str | None) -> list[DecodeConfig]:
    shipped = [controllers.shipped(DecodeConfig.of(schedule="sglang-adaptive", batch_size=b, max_new_tokens=tokens))
               .replace(batch_size=1) for b in (1, 8)]
    tuned = [policy(s, max_new_tokens=tokens) for s in (
        {"candidate_steps": [1, 2, 4, 6], "ema_alpha": 0.1, "update_interval": 5, "warmup_batches": 0},
        {"candidate_steps": [0, 1, 3], "ema_alpha": 0.5, "update_interval": 1, "warmup_batches": 0},
        {"candidate_steps": [2, 4, 6, 8], "ema_alpha": 1.0, "update_interval": 2, "warmup_batches": 1,
         "ceiling_coeff": 1.5})]
    trtllm = [DecodeConfig.of(schedule="trtllm-schedule", draft_len_schedule="1:4,8:2,32:1", max_new_tokens=tokens,
                              **gate) for gate in ({}, {"acceptance_rate_window_size": 16,
                                                         "acceptance_rate_threshold": 0.5})]
    vllm = [] if goodput_model is None else [
        DecodeConfig.of(schedule="vllm-adaptive", gamma_max=4, goodput_model=goodput_model, max_new_tokens=tokens,
                        num_speculative_tokens_per_batch_size=table) for table in ("", "1-4:4,5-16:3,17-64:2")]
    return shipped + tuned + trtllm + vllm


def against_decoder(pair, ids: list[list[int]], rec, tokens: int, goodput_model: str | None) -> list[dict]:
    rows, plain = [], [autoregressive_decode(pair.target, p, DecodeConfig.of(max_new_tokens=tokens), pair.eos_ids)
                        .tokens for p in ids]
    for config in checked_policies(tokens, goodput_model):
        state, compared, differ, outputs, lengths, trimmed = None, 0, 0, 0, set(), 0
        for prompt, expected, replayed in zip(ids, plain, simulate(rec, config)):
            real = speculative_decode(pair.target, pair.draft, prompt, config, pair.eos_ids, controller=state)
            state = real.controller
            pairs = list(zip(replayed, real.rounds))
            compared += len(pairs)
            differ += sum((a.drafted, a.accepted, a.emitted, a.stop_reason) != (b.drafted, b.accepted, b.emitted,
                                                                                 b.stop_reason) for a, b in pairs)
            differ += abs(len(replayed) - len(real.rounds))
            outputs += real.tokens != expected
            lengths |= {r.drafted for r in replayed}
            trimmed += sum(r.drafted < r.draft_forwards for r in real.rounds)  # vLLM's: verified fewer than drafted
        batched = config.replace(batch_size=8)
        served = [r for q in batched_speculative(pair.target, pair.draft, ids, batched, 8, pair.eos_ids)
                  for r in q.result.rounds]
        zeros = np.zeros(len(ids))
        walked = walk_controlled(rec, batched, StepPrices.flat(np.zeros(9), np.zeros((9, G + 1))), unpriced(len(ids)),
                                 True, match_lengths(rec), zeros, zeros.copy(), zeros.copy())
        rows.append({"policy": config.label(), "rounds_compared": compared, "rounds_differ": differ,
                     "outputs_not_the_target_s": outputs, "lengths_run": sorted(lengths), "trimmed": trimmed,
                     "b8_rounds": [len(served), walked["rounds"]],
                     "b8_drafted": [sum(r.drafted for r in served), walked["drafted_total"]],
                     "b8_accepted": [sum(r.accepted for r in served), walked["accepted_total"]]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--goodput-model", help="a sweep's folder: vLLM's adaptive verification prices with its costs")
    args = parser.parse_args()
    pair = load_pair(device="cpu")
    prompts, _, _ = load_prompts("code", None, limit=args.limit)
    ids = [encode(pair.tokenizer, p.text) for p in prompts]
    rec = record(pair, ids, args.tokens, G)
    found = {"sglang": against_sglang(rec, args.tokens), "decoder": against_decoder(pair, ids, rec, args.tokens,
                                                                                     args.goodput_model)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "controllers.json").write_text(json.dumps(found, indent=2) + "\n")
    lines = ["| against SGLang's AdaptiveStepSlot | steps | the same pick |", "|---|---:|---:|"]
    lines += [f"| {kind} | {v['steps']:,} | {v['same']:,} |" for kind, v in found["sglang"].items()]
    lines += ["", "| policy (batch 1; B = 8 as served) | rounds compared | differ | outputs not the target's | "
              "rounds trimmed | B = 8 rounds · drafted · accepted (decoder / replay) |",
              "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['policy']} | {r['rounds_compared']:,} | {r['rounds_differ']} | {r['outputs_not_the_target_s']} | "
              f"{r['trimmed']:,} | "
              f"{' · '.join(f'{a}/{b}' for a, b in (r['b8_rounds'], r['b8_drafted'], r['b8_accepted']))} |"
              for r in found["decoder"]]
    (args.out / "controllers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
