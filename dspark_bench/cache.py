"""A causal LM with its own KV cache, fed tokens directly (no `generate`).

`length` counts the tokens in the cache; `rollback` crops it — the one place where rejected
tokens leave a cache. Positions follow from the cache length, so nothing else needs fixing.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache


def _forward_kwargs(model) -> tuple[str, bool]:
    # transformers 5 renamed `past_key_values` to `cache`; older models and remote code still
    # use the old name. `logits_to_keep` saves the LM head over positions we do not read.
    params = inspect.signature(model.forward).parameters
    cache_name = "cache" if "cache" in params else "past_key_values"
    return cache_name, "logits_to_keep" in params


class CachedLM:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = DynamicCache()
        self.length = 0
        self._cache_name, self._can_keep = _forward_kwargs(model)

    def forward(self, tokens: list[int], keep: int = 1) -> torch.Tensor:
        """Feed `tokens` after the cached ones; logits of the last `keep` positions [keep, vocab]."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        kwargs = {self._cache_name: self.cache, "use_cache": True}
        if self._can_keep:
            kwargs["logits_to_keep"] = keep
        logits = self.model(input_ids=ids, **kwargs).logits
        self.length += len(tokens)
        return logits[0, -keep:]

    def prefill(self, tokens: list[int]) -> None:
        if tokens:
            self.forward(tokens, keep=1)

    def rollback(self, length: int) -> None:
        """Forget every cached token from position `length` on."""
        if length < self.length:
            # A negative argument removes that many tokens, in transformers 4.x and 5.x alike.
            self.cache.crop(length - self.length)
            self.length = length
