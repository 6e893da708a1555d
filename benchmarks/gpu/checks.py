"""The GPU run's correctness and sync stages (benchmarks/gpu): what must hold on CUDA exactly as
it holds in the tests on a CPU.

- greedy, fp32: every (metric, schedule) the tests cover, decoded speculatively at batch 1 in
  both draft modes and in the batched decoder, gives the target's own greedy tokens;
- bf16: the run's own divergence report (identical share, first divergence) over a few prompts;
- sampling: the first two sampled tokens of a tiny pair built on the device follow the target's
  exact joint distribution (chi-square), and a broken rule (resampling from p on rejection) fails
  the same test, so the test has the power to see a wrong rule;
- host syncs per round: `host.fetch`'s own count, and every synchronising call CUDA's sync debug
  mode sees (a blocking copy, an implicit sync in a kernel), early-stop and verify-side.
"""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
# A goodput model (acceptance curves and step costs) that makes the cost-aware schedules both draft
# on and stop: the tests' own (tests/tiny.py); any valid model serves, the output must not change.
GOODPUT_MODEL = str(ROOT / "tests" / "data" / "goodput_model.json")


def greedy_policies(max_new_tokens: int):
    """One policy per (metric, schedule), the knobs varied as tests/test_batched.py varies them."""
    from dspark_bench import schedules
    from dspark_bench.config import METRICS, SCHEDULES, SEMANTICS, DecodeConfig

    for i, (metric, schedule) in enumerate(itertools.product(METRICS, SCHEDULES)):
        semantics = "dspark" if schedule == "budget" else SEMANTICS[i % len(SEMANTICS)]
        # the depth schedule: this threshold and γ_max in the first depth bucket, half the threshold deeper
        depth_policy = "0.4/4,0.2/4" if schedules.named(schedule).by_depth else ""
        # an engine's controller: lengths up to 4 as well, moving from the first steps (SGLang's) or with
        # the rows (TensorRT-LLM's, vLLM's, whose budget trims on the goodput model's step costs too)
        controller = ({"candidate_steps": "0,1,2,4", "warmup_batches": 0, "update_interval": 1,
                       "draft_len_schedule": "1:4,2:2", "num_speculative_tokens_per_batch_size": "1-1:4,2-8:2"}
                      if schedules.named(schedule).controlled else {})
        controller = {k: v for k, v in controller.items() if k in schedules.named(schedule).reads}
        yield DecodeConfig.of(metric=metric, schedule=schedule, threshold=0.4, threshold_start=0.2, threshold_end=0.6,
                              gamma_max=4, min_draft_len=i % 3, max_new_tokens=max_new_tokens, semantics=semantics,
                              depth_policy=depth_policy, **controller,
                              goodput_model=GOODPUT_MODEL if schedules.named(schedule).reads_costs else "")


def greedy_identity(pair, ids: list[list[int]], max_new_tokens: int, batch_size: int) -> dict:
    """Speculative greedy output against the target's own, token for token: every policy at batch 1
    (early-stop and verify-side) and, for the schedules that decide per row, batched."""
    from dspark_bench.decoding.autoregressive import autoregressive_decode

    policies = list(greedy_policies(max_new_tokens))
    expected = [autoregressive_decode(pair.target, p, policies[0], pair.eos_ids).tokens for p in ids]
    checked, differ, accepted, rejected = at_batch_one(pair, ids, policies, expected)
    batched = batched_identity(pair, ids, policies, expected, batch_size)
    checked, differ = checked + batched["decodes"], differ + batched["differ"]
    # Both paths must be exercised, or equality would prove little.
    return {"decodes": checked, "policies": len(policies), "prompts": len(ids), "batch_size": batch_size,
            "identical": not differ and accepted > 0 and rejected > 0, "differ": differ[:20],
            "accepted_tokens": accepted, "rejected_rounds": rejected,
            "captured": captured_identity(pair, ids, policies, expected, batch_size)}


def at_batch_one(pair, ids: list[list[int]], policies, expected: list[list[int]], **changes):
    """Every policy (with `changes`) at batch 1 in both draft modes against `expected`: (decodes,
    those that differ, tokens accepted, rounds holding a rejection)."""
    from dspark_bench import schedules
    from dspark_bench.decoding.speculative import speculative_decode

    checked, differ, accepted, rejected = 0, [], 0, 0
    for config in policies:
        # vLLM's controller trims each draft on the host: early-stop only (config.check_combination)
        for mode in ("early-stop",) if schedules.of(config).priced else ("early-stop", "verify-side"):
            policy = config.replace(draft_mode=mode, **changes)
            for p, prompt in enumerate(ids):
                result = speculative_decode(pair.target, pair.draft, prompt, policy, pair.eos_ids)
                checked += 1
                accepted += sum(r.accepted for r in result.rounds)
                rejected += sum(r.accepted < r.drafted for r in result.rounds)
                if result.tokens != expected[p]:
                    differ.append(f"{policy.label()} · prompt {p}")
    return checked, differ, accepted, rejected


def captured_identity(pair, ids: list[list[int]], policies, eager_expected: list[list[int]], batch_size: int) -> dict:
    """The captured path (what CUDA decodes by default: compiled passes, a CUDA graph per length)
    against its own baseline, token for token, every policy at batch 1 in both draft modes and
    batched; and whether that baseline is the eager one's (compiled kernels may round otherwise
    after a near-tie)."""
    from dspark_bench.decoding.autoregressive import autoregressive_decode

    captured = policies[0].replace(compiled=True)
    expected = [autoregressive_decode(pair.target, p, captured, pair.eos_ids).tokens for p in ids]
    checked, differ, accepted, rejected = at_batch_one(pair, ids, policies, expected, compiled=True)
    batched = batched_identity(pair, ids, [c.replace(compiled=True) for c in policies], expected, batch_size)
    return {"decodes": checked + batched["decodes"], "identical": not differ and accepted > 0 and rejected > 0
            and not batched["differ"], "differ": (differ + batched["differ"])[:20],
            "batched_decodes": batched["decodes"], "baseline_equals_eager": expected == eager_expected}


def batched_identity(pair, ids: list[list[int]], policies, expected: list[list[int]], batch_size: int) -> dict:
    """The batched decoder (captured where `policies` are compiled: static_batch_lm.py) against
    `expected`, for the schedules that decide per row (budget decides for the whole batch)."""
    from dspark_bench.decoding.batched import batched_speculative

    checked, differ = 0, []
    for config in policies:
        if config.stopping.schedule == "budget":
            continue
        decoded = batched_speculative(pair.target, pair.draft, ids, config, batch_size, pair.eos_ids)
        for p, request in enumerate(decoded):
            checked += 1
            if request.result.tokens != expected[p]:
                differ.append(f"{config.label()} · B={batch_size} · prompt {p}")
    return {"decodes": checked, "differ": differ}


def bf16_divergence(prompts, device: str, say, max_new_tokens: int) -> dict:
    """The run's own divergence report for the shipped pair in bf16 (what `run --dtype bfloat16` prints)."""
    from dspark_bench.config import DecodeConfig
    from dspark_bench.harness.models import load_pair
    from dspark_bench.harness.runner import RunnerSettings, run
    from dspark_bench.metrics import summarize

    pair = load_pair(None, None, device, "bfloat16")
    policies = [DecodeConfig.of(schedule="fixed", gamma_max=4, min_draft_len=0, max_new_tokens=max_new_tokens),
                DecodeConfig.of(metric="top1", threshold=0.3, gamma_max=6, max_new_tokens=max_new_tokens)]
    out = run(pair, prompts, policies, RunnerSettings(warmup=1))
    rows = []
    for _, s in summarize(out.samples).iterrows():
        rows.append({"policy": policies[int(s["config_id"])].label(),
                     "identical_to_baseline": float(s["identical_to_baseline"]),
                     "first_divergence_min": s.get("first_divergence_min"),
                     "identical_share": float(s.get("identical_share", float("nan")))})
    say("bf16: " + ", ".join(f"{r['policy']}: {r['identical_to_baseline']:.2f} identical" for r in rows))
    return {"dtype": "bfloat16", "prompts": len(prompts), "rows": rows}


def sampling_chi_square(device: torch.device, samples: int) -> dict:
    """The first two sampled tokens of a tiny pair (vocabulary 6, independent draft) against the
    target's exact joint distribution; and the same test on a broken rule, which must fail it."""
    from dspark_bench.config import DecodeConfig
    from dspark_bench.decoding import speculative
    from dspark_bench.decoding.sampling import distribution
    from tests import tiny  # the tests' tiny pair builder (CPU), moved to the device below
    from tests.tiny import chi_square_p  # the tests' own chi-square, rare cells pooled

    vocab = 6
    target, draft = tiny.llama(vocab=vocab, seed=3).to(device), tiny.llama(layers=1, vocab=vocab, seed=4).to(device)
    config = DecodeConfig.of(temperature=1.0, top_p=0.9, threshold=0.0, gamma_max=3, max_new_tokens=3)
    prompt = [2, 4]
    with torch.inference_mode():
        first = distribution(target(torch.tensor([prompt], device=device)).logits[0, -1], config)
        joint = torch.stack([first[x] * distribution(target(torch.tensor([prompt + [x]], device=device)).logits[0, -1],
                                                     config) for x in range(vocab)])
    exact = joint.flatten().double().cpu().numpy()

    def counts(n: int) -> np.ndarray:
        c = np.zeros(vocab * vocab)
        for seed in range(n):
            tokens = speculative.speculative_decode(target, draft, prompt, config.replace(seed=seed)).tokens
            c[tokens[0] * vocab + tokens[1]] += 1
        return c

    lossless = chi_square_p(counts(samples), exact)
    original = speculative.residual_distribution
    speculative.residual_distribution = lambda p, q: p  # the classic bug: on rejection, draw from p
    try:
        broken = chi_square_p(counts(samples), exact)
    finally:
        speculative.residual_distribution = original
    return {"samples": samples, "p_value": lossless, "broken_rule_p_value": broken,
            "lossless": lossless > 0.001 and broken < 1e-4}


def sync_counts(pair, ids: list[int], policies) -> list[dict]:
    """Per round: host.fetch's reads, and on CUDA every synchronising call its sync debug mode sees."""
    from dspark_bench.decoding.host import counting
    from dspark_bench.decoding.speculative import speculative_decode

    rows = []
    for config in policies:
        for mode in ("early-stop", "verify-side"):
            policy = config.replace(draft_mode=mode)
            speculative_decode(pair.target, pair.draft, ids, policy, pair.eos_ids)  # warm: first-use syncs aside
            cuda = pair.device.type == "cuda"
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                with warnings.catch_warnings(record=True) as caught, counting() as count:
                    warnings.simplefilter("always")
                    result = speculative_decode(pair.target, pair.draft, ids, policy, pair.eos_ids)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
            rounds = len(result.rounds)
            seen = [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]
            rows.append({"policy": policy.label(), "draft_mode": mode, "rounds": rounds,
                         "fetches_per_round": count.fetches / rounds,
                         "cuda_syncs_per_round": len(seen) / rounds if cuda else None,
                         "drafted_per_round": sum(r.drafted for r in result.rounds) / rounds,
                         "sync_kinds": sorted({s.split(".")[0][:120] for s in seen})[:5]})
    return rows
