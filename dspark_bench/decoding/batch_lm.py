"""B rows of one causal LM decoding together, each at its own length (the padded layout).

The rows share the cache's columns; `mask` [B, T] marks the columns that hold a row's real
tokens. A row's tokens are its real columns in order, so rolling a row back turns its last
columns into holes (mask 0) instead of moving anything, and positions come from each row's own
token count (`lengths`), never from the column. A forward feeds every row its own tokens, padded
on the right to the longest feed: the pass costs what B × that longest feed costs, which is
what "padded" means in every result. Columns that are holes in every row are cut from the end,
and the cache is compacted when holes fill more than a quarter of it.

A row is prefilled alone (batch 1) and then spliced in, so a request joining a running batch
(continuous batching) costs its own prefill and nothing else; rows leave the batch when done.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from dspark_bench.decoding.cached_lm import forward_kwargs
from dspark_bench.errors import DsparkError


def prefill_alone(model: torch.nn.Module, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values [1, heads, len(tokens), dim] of `tokens` prefilled alone: a row
    about to join a batch (here, or a static batch: static_batch_lm.py)."""
    cache_name, can_keep = forward_kwargs(model)
    alone = DynamicCache()
    ids = torch.tensor([tokens], dtype=torch.long, device=next(model.parameters()).device)
    model(input_ids=ids, **{cache_name: alone, "use_cache": True, **({"logits_to_keep": 1} if can_keep else {})})
    return [(layer.keys, layer.values) for layer in alone.layers]


class BatchLM:
    def __init__(self, model: torch.nn.Module, pad_id: int = 0):
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        self.cache = DynamicCache()
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.lengths: list[int] = []
        self._cache_name, self._can_keep = forward_kwargs(model)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def _layers(self):
        layers = getattr(self.cache, "layers", None)
        if layers is None or any(not hasattr(layer, "keys") for layer in layers):
            raise DsparkError("batched decoding needs a model with a plain key/value cache (DynamicCache); "
                              "run this model with --batch-size 1")
        return layers

    def _call(self, ids: torch.Tensor, cache, keep: int = 0, **kwargs) -> torch.Tensor:
        """keep: logits of the last `keep` positions (0: every position, as rows of a batch read
        theirs at different places; a prefill needs none but the last)."""
        kwargs = {self._cache_name: cache, "use_cache": True, **kwargs}
        if self._can_keep:
            kwargs["logits_to_keep"] = keep
        return self.model(input_ids=ids, **kwargs).logits

    def add(self, tokens: list[int]) -> None:
        """A new last row whose cache holds `tokens` (a prompt but its last token), prefilled alone."""
        kv = prefill_alone(self.model, tokens) if tokens else None
        columns = self.mask.shape[1]
        if kv is not None and not self._initialized():
            # Nothing cached yet: earlier rows (all without a prefill) get empty tensors to join.
            self._set([(k.new_zeros(self.rows, *k.shape[1:2], 0, k.shape[-1]),
                        v.new_zeros(self.rows, *v.shape[1:2], 0, v.shape[-1])) for k, v in kv])
        if kv is not None and len(tokens) > columns:
            self._grow_left(len(tokens) - columns)
            columns = len(tokens)
        row_mask = torch.zeros(1, columns, dtype=torch.long, device=self.device)
        if kv is not None:
            row_mask[0, columns - len(tokens) :] = 1
            joined = []
            for (k, v), layer in zip(kv, self._layers()):
                pad = columns - len(tokens)
                k = torch.nn.functional.pad(k, (0, 0, pad, 0))
                v = torch.nn.functional.pad(v, (0, 0, pad, 0))
                joined.append((torch.cat([layer.keys, k]), torch.cat([layer.values, v])))
            self._set(joined)
        elif self._initialized():
            self._set([(torch.cat([layer.keys, layer.keys.new_zeros(1, *layer.keys.shape[1:])]),
                        torch.cat([layer.values, layer.values.new_zeros(1, *layer.values.shape[1:])]))
                       for layer in self._layers()])
        self.mask = torch.cat([self.mask, row_mask])
        self.lengths.append(len(tokens))

    def remove(self, row: int) -> None:
        keep = [i for i in range(self.rows) if i != row]
        if self._initialized():
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            self._set([(layer.keys[index], layer.values[index]) for layer in self._layers()])
        self.mask = self.mask[keep]
        del self.lengths[row]

    def forward(self, feeds: list[list[int]]) -> torch.Tensor:
        """Feed row i the tokens feeds[i] after its own; logits [B, n, vocab], n the longest feed.

        Row i's logits for its feed are at positions 0 .. len(feeds[i]) - 1; an empty feed leaves
        the row as it was (its new column is a hole)."""
        n = max(len(feed) for feed in feeds)
        ids = torch.full((self.rows, n), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros(self.rows, n, dtype=torch.long)
        for i, feed in enumerate(feeds):
            ids[i, : len(feed)] = torch.tensor(feed, dtype=torch.long)
            new_mask[i, : len(feed)] = 1
        positions = torch.tensor(self.lengths, dtype=torch.long)[:, None] + torch.arange(n)
        attention = torch.cat([self.mask, new_mask.to(self.device)], dim=1)
        logits = self._call(ids.to(self.device), self.cache, attention_mask=attention,
                            position_ids=positions.to(self.device))
        self.mask = attention
        self.lengths = [length + len(feed) for length, feed in zip(self.lengths, feeds)]
        return logits

    def rollback(self, lengths: list[int]) -> None:
        """Forget each row's tokens from position lengths[row] on (they become holes)."""
        if any(new < old for new, old in zip(lengths, self.lengths)):
            keep = torch.tensor(lengths, dtype=torch.long, device=self.device)[:, None]
            self.mask = self.mask * (self.mask.cumsum(1) <= keep)
            self.lengths = [min(new, old) for new, old in zip(lengths, self.lengths)]

    def tidy(self) -> None:
        """Cut the leading and trailing columns no row uses (rows that left, drafts rolled back);
        compact when holes fill a quarter of the cache. Every pass attends over every column, so
        a cache left to grow would slow the batch down with nothing to show for it."""
        if self.rows == 0:  # every row left: start afresh rather than keep their columns
            self.cache, self.mask = DynamicCache(), self.mask.new_zeros(0, 0)
            return
        if not self._initialized():
            return
        used = self.mask.any(dim=0).nonzero()
        start, end = (int(used[0]), int(used[-1]) + 1) if len(used) else (0, 0)
        if start > 0 or end < self.mask.shape[1]:
            self._set([(layer.keys[:, :, start:end], layer.values[:, :, start:end]) for layer in self._layers()])
            self.mask = self.mask[:, start:end]
        if self.mask.shape[1] > 8 + max(self.lengths) * 5 // 4:
            self._compact()

    def _compact(self) -> None:
        """Move every row's real columns to the right end, in order; holes go to the left."""
        width = max(self.lengths)
        index = torch.zeros(self.rows, width, dtype=torch.long, device=self.device)
        mask = torch.zeros(self.rows, width, dtype=torch.long, device=self.device)
        for row in range(self.rows):
            real = self.mask[row].nonzero().flatten()
            index[row, width - len(real) :] = real
            mask[row, width - len(real) :] = 1
        compacted = []
        for layer in self._layers():
            b, h, _, d = layer.keys.shape
            gather = index[:, None, :, None].expand(b, h, width, d)
            compacted.append((layer.keys.gather(2, gather), layer.values.gather(2, gather)))
        self._set(compacted)
        self.mask = mask

    def _grow_left(self, columns: int) -> None:
        self._set([(torch.nn.functional.pad(layer.keys, (0, 0, columns, 0)),
                    torch.nn.functional.pad(layer.values, (0, 0, columns, 0))) for layer in self._layers()])
        self.mask = torch.nn.functional.pad(self.mask, (columns, 0))

    def _initialized(self) -> bool:
        layers = getattr(self.cache, "layers", None) or []
        return bool(layers) and all(getattr(layer, "is_initialized", False) for layer in layers)

    def _set(self, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        layers = self.cache.layers
        while len(layers) < len(tensors):  # a new cache makes its layers at its first update
            layers.append((getattr(self.cache, "layer_class_to_replicate", None) or DynamicLayer)())
        for layer, (k, v) in zip(layers, tensors):
            if not getattr(layer, "is_initialized", False):
                try:
                    layer.lazy_initialization(k, v)
                except TypeError:  # transformers 4.56-4.57 take the keys only
                    layer.lazy_initialization(k)
            layer.keys, layer.values = k, v
