"""Making a sampled record (replay/sampled.py): K sampled paths of the target per prompt, and
along each what replay under sampling needs — p and q of the path's token, the rejected token
drawn from the residual and the draft's own sampled rollout after it, with its confidences.
"""

from __future__ import annotations

import numpy as np
import torch

from dspark_bench.config import DecodeConfig, Drafting
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.sampling import distribution, draw
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import draft_rollouts, record
from dspark_bench.replay.record import Record
from dspark_bench.replay.sampled import SEED_STRIDE, PathRecord, SampledRecord, assemble, sampling_of


def rollout_seed(seed: int) -> int:
    """The seed of the rollouts of the path sampled with `seed`: a stream that no path samples from,
    so that a path's rejected tokens are independent of its own tokens and of every other path's
    (the interval over paths takes them for independent draws). Neither seed + 1 (the next path's
    seed) nor seed + 2^40 (a CPU generator reads a seed's low 32 bits only: the path's own stream)
    would do; SeedSequence spreads every bit of the seed over all 64."""
    return int(np.random.SeedSequence([seed, 1]).generate_state(1, np.uint64)[0])


def one_hot_if_greedy(logits: torch.Tensor, config: DecodeConfig) -> torch.Tensor:
    """The distribution a token is drawn from: the processed one, or greedy's one-hot argmax."""
    if config.greedy:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).double()
    return distribution(logits, config).double()


@torch.inference_mode()
def record_path(pair, ids: list[int], config: DecodeConfig, gamma: int, topk: int, seed: int,
                eos_ids: frozenset[int]) -> PathRecord:
    """Sample the target's path (a plain decode at the config's temperature and top-p, `seed`) and
    record what replay needs along it (`record_along`, its rollouts seeded by rollout_seed(seed))."""
    path = autoregressive_decode(pair.target, ids, config.replace(seed=seed), eos_ids).tokens
    return record_along(pair, ids, path, config, gamma, topk, rollout_seed(seed))


@torch.inference_mode()
def record_along(pair, ids: list[int], path: list[int], config: DecodeConfig, gamma: int, topk: int,
                 seed: int) -> PathRecord:
    """What replay needs along a path of the target's law (a plain decode's, or our speculative
    decoder's own output, which has that law: benchmarks/checks/sampled_lean.py pairs the two):
    p and q along it (one forward of each model), each position's rejected token drawn from the
    residual and the draft rolled out from it (recording.draft_rollouts, sampling), drawn from a
    generator seeded with `seed`."""
    n, device = len(path), next(pair.draft.parameters()).device
    context = torch.tensor([ids + path[:-1]], device=device)
    p = one_hot_if_greedy(pair.target(input_ids=context).logits[0, len(ids) - 1 :], config)
    q = one_hot_if_greedy(pair.draft(input_ids=context).logits[0, len(ids) - 1 :], config)
    y = torch.tensor(path, device=device)[:, None]
    residual = (q - p).clamp_min(0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, q)  # p == q: never rejected
    generator = torch.Generator(device=device).manual_seed(seed)
    rejected = draw(residual, generator)

    def choose(step: int, rows: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if step == 0:
            return rejected[rows]
        return logits.argmax(dim=-1) if config.greedy else draw(distribution(logits, config), generator)

    tokens, scores = draft_rollouts(pair.draft, ids + path, len(ids), n, gamma, topk, choose=choose,
                                    probs_of=lambda logits: distribution(logits, config))
    return PathRecord(path, p.gather(1, y)[:, 0].cpu().numpy(), q.gather(1, y)[:, 0].cpu().numpy(), tokens, scores)


def record_sampled(pair, prompt_ids: list[list[int]], config: DecodeConfig, gamma: int, paths: int, topk: int = 5,
                   info: dict | None = None, progress=None, eos_ids: frozenset[int] | None = None,
                   drafter: Drafting | None = None) -> Record | SampledRecord:
    """`paths` sampled paths of every prompt at `config`'s temperature and top-p, recorded for
    replay: a SampledRecord for the draft model, a greedy-shaped Record over the paths for the
    lookup drafter (its proposals do not depend on what was accepted)."""
    eos_ids = pair.eos_ids if eos_ids is None else frozenset(eos_ids)
    drafter = drafter or Drafting()
    if drafter.drafter == "heads":
        raise DsparkError("sampled replay records the draft model and the lookup drafter; the heads drafter at "
                          "temperature > 0 is timed (--evaluation real)")
    seeds = [[config.verification.seed + SEED_STRIDE * p + k for k in range(paths)] for p in range(len(prompt_ids))]
    rows = [ids for ids in prompt_ids for _ in range(paths)]
    meta = {**(info or {}), "sampling": sampling_of(config, paths), "path_seeds": seeds, "paths_of": len(prompt_ids)}
    if drafter.drafter == "lookup":
        drawn = []
        for ids, row_seeds in zip(prompt_ids, seeds):
            drawn += [autoregressive_decode(pair.target, ids, config.replace(seed=seed), eos_ids).tokens
                      for seed in row_seeds]
            if progress:
                progress()
        return record(pair, rows, config.verification.max_new_tokens, gamma, topk, meta, None, eos_ids, drafter,
                      continuations=drawn)
    parts = []
    for ids, row_seeds in zip(prompt_ids, seeds):
        for seed in row_seeds:
            parts.append(record_path(pair, ids, config, gamma, topk, seed, eos_ids))
        if progress:
            progress()
    return assemble(parts, rows, config.verification.max_new_tokens, gamma, topk, eos_ids, drafter, meta)
