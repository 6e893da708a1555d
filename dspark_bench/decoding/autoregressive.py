"""Decoders that speculative decoding is measured against; same contract as the speculative decoder.

`autoregressive_decode` uses the decoder's own cache and sampling code, one target forward per
token, so speedup is measured against a loop as fast as a plain loop can be. The Hugging Face
`generate` peers exist to show that this baseline is not the slow one.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.cached_lm import CachedLM
from dspark_bench.decoding.sampling import choose, distribution, make_generator
from dspark_bench.decoding.types import DecodeResult, PassClock, Round


@torch.inference_mode()
def autoregressive_decode(
    target: torch.nn.Module, prompt_ids: list[int], config: DecodeConfig, eos_ids: frozenset[int] = frozenset(),
    clock: PassClock | None = None,
) -> DecodeResult:
    """`clock`: times every pass and step (in-decode costs: measure/pass_clock.py), None for none."""
    target_lm = CachedLM(target, config.verification.compiled, len(prompt_ids) + config.verification.max_new_tokens,
                         clock=clock)
    target_lm.prefill(prompt_ids[:-1])
    generator = make_generator(config, target_lm.device)
    result, pending = DecodeResult(tokens=[]), prompt_ids[-1:]
    while len(result.tokens) < config.verification.max_new_tokens:
        if clock is not None:  # a plain step is a round of one pass
            clock.round_starts()
        logits = target_lm.forward(pending)[-1]
        result.target_forwards += 1
        probs = None if config.greedy else distribution(logits, config)  # greedy needs only argmax
        token = choose(logits, probs, config, generator)
        result.tokens.append(token)
        if token in eos_ids:
            break
        pending = [token]
    if clock is not None:
        clock.decode_ends()
    return result


@torch.inference_mode()
def hf_generate(
    target: torch.nn.Module,
    prompt_ids: list[int],
    config: DecodeConfig,
    eos_ids: frozenset[int] = frozenset(),
    assistant: torch.nn.Module | None = None,
) -> DecodeResult:
    """`model.generate`, plain or assisted by a draft: a peer, not the baseline."""
    device = next(target.parameters()).device
    ids = torch.tensor([prompt_ids], device=device)
    kwargs = dict(max_new_tokens=config.verification.max_new_tokens, do_sample=not config.greedy, min_new_tokens=0)
    if not config.greedy:
        kwargs.update(temperature=config.verification.temperature, top_p=config.verification.top_p, top_k=0)
    if assistant is not None:
        kwargs["assistant_model"] = assistant
    # Assisted generation verifies several tokens per target pass: count the passes themselves.
    forwards = []
    hook = target.register_forward_hook(lambda *_: forwards.append(1))
    try:
        out = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            eos_token_id=sorted(eos_ids) or None,
            pad_token_id=min(eos_ids) if eos_ids else 0,
            **kwargs,
        )
    finally:
        hook.remove()
    tokens = out[0, len(prompt_ids) :].tolist()
    return DecodeResult(tokens=tokens, target_forwards=len(forwards) - 1)  # the prefill is not counted


def hf_assistant_settings(config: DecodeConfig) -> dict:
    """The assistant's generation-config knobs that run `config` under HF's own rule (what
    `export --format hf` writes). A fixed schedule is a threshold of 0 (HF then never stops early)."""
    return {"num_assistant_tokens": config.stopping.gamma_max, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0 if schedules.of(config).baseline else config.stopping.threshold}


@contextlib.contextmanager
def hf_rounds(rounds: list[Round]):
    """Record each round of HF's assisted generation (drafted, accepted) as it updates its candidate
    strategy, with HF's threshold re-fit switched off: with scikit-learn installed HF re-fits
    assistant_confidence_threshold every round from an ROC curve, and the policy run must be the
    policy exported (and replayed)."""
    from transformers.generation import candidate_generator as hf

    original = hf.AssistedCandidateGenerator.update_candidate_strategy

    def update(self, input_ids, scores, num_matches):
        drafted = scores.shape[1] - 1
        budget = self.main_model_max_length - (input_ids.shape[1] - int(num_matches) - 1) - 1
        reason = ("gamma_max" if drafted >= self.num_assistant_tokens else "budget" if drafted >= budget
                  else "threshold")  # (or EOS: HF does not say which)
        rounds.append(Round(drafted, int(num_matches), int(num_matches) + 1, reason, [], [], -1, 0))
        return original(self, input_ids, scores, num_matches)

    sklearn = hf.is_sklearn_available
    hf.AssistedCandidateGenerator.update_candidate_strategy = update
    hf.is_sklearn_available = lambda: False
    try:
        yield
    finally:
        hf.AssistedCandidateGenerator.update_candidate_strategy = original
        hf.is_sklearn_available = sklearn


@torch.inference_mode()
def hf_assisted_decode(
    target: torch.nn.Module, draft: torch.nn.Module, prompt_ids: list[int], config: DecodeConfig,
    eos_ids: frozenset[int] = frozenset(),
) -> DecodeResult:
    """HF assisted generation (`generate(assistant_model=draft)`) running `config` under HF's rule:
    `run --decoder hf`, a peer engine timed against the same baseline. Its rounds come from HF's
    own bookkeeping (drafted and accepted per target pass); confidences are not exposed."""
    saved = draft.generation_config
    draft.generation_config = copy.deepcopy(saved)
    draft.generation_config.update(**hf_assistant_settings(config))
    rounds: list[Round] = []
    forwards = []
    hook = draft.register_forward_hook(lambda *_: forwards.append(1))
    try:
        with hf_rounds(rounds):
            result = hf_generate(target, prompt_ids, config, eos_ids, assistant=draft)
    finally:
        hook.remove()
        draft.generation_config = saved
    result.rounds, result.draft_forwards = rounds, len(forwards)
    result.target_forwards = len(rounds)  # assisted generation has no separate prefill pass
    return result
