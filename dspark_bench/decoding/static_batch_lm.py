"""B rows decoding together on a static KV cache: the batched decoder's passes, captured.

BatchLM's padded layout (batch_lm.py) on preallocated tensors whose addresses never change, so
that every pass after the prefill runs through torch.compile's "reduce-overhead" mode (a CUDA
graph per shape on a GPU, as cached_lm.py does at batch 1):

- **Slots.** The cache has `slots` rows for its whole life (the run's batch size). A request
  takes a free slot when it joins and frees it when it leaves. Every pass feeds every slot (a
  free one the pad token, its result dropped), so a pass has the shape (slots, n): one graph per
  n = 1 … gamma_max + 1 serves the run. That is one (B, k) bucket per pass length with B fixed at
  the batch size — engines capture a ladder of batch sizes (vLLM: 1, 2, 4, 8, …) and pad a
  smaller batch to the next rung; ours has one rung, so a batch draining at the end of a run (or
  below capacity under load) pays for its free slots, and a free slot costs what a row costs.
- **Columns.** Rows share the cache's columns, written at its one length as transformers'
  `StaticCache` writes them; `mask` [slots, columns of the cache] marks each row's real columns.
  A pass attends over every column of the cache (what a static cache costs in transformers'
  own generate too), so the cache is sized to the run, not to the model's context.
  Rolling a row back makes holes; columns past every row's last real one are given back (the
  length moves back in place); when a pass would run past the end, every row's real columns are
  moved to the left, in place.
- **Joining.** A prompt is prefilled alone and eagerly (its length changes with every prompt,
  so it would compile a graph for each), into a DynamicCache copied to the first columns of its
  slot; its later tokens go where every row's go. Positions come from each row's own count.

The cache is the model's (cached_lm.static_cache, per role and slot count), reused by every
run: a new one would compile and capture again. So two batched decodes of one model and role
cannot run side by side; `take` refuses the second instead of mixing their rows.
"""

from __future__ import annotations

import weakref

import torch

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.batch_lm import BatchLM, prefill_alone
from dspark_bench.decoding.cached_lm import compiled_forward, forward_kwargs, set_length, static_cache
from dspark_bench.errors import DsparkError

_OWNER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # static cache -> the decode using it


class StaticBatchLM:
    """BatchLM's interface (add, remove, forward, rollback, tidy, rows, lengths) on a static cache;
    `compiled=False` runs the same layout eagerly (tests check the layout apart from compiling)."""

    def __init__(self, model: torch.nn.Module, slots: int, capacity: int, role: str = "target",
                 compiled: bool = True, pad_id: int = 0):
        self.model, self.role, self.compiled, self.pad_id = model, role, compiled, pad_id
        self.device = next(model.parameters()).device
        self.slots = slots
        self.cache = static_cache(model, capacity, role, rows=slots, empty=False)  # emptied when taken
        self._cache_name, self._can_keep = forward_kwargs(model)
        self._lay_out()
        self.capacity = self.cache.layers[0].max_cache_len
        self.mask = torch.zeros(slots, self.capacity, dtype=torch.long, device=self.device)
        self.columns = 0  # the cache's length: columns written so far, every slot's
        self.slot_of: list[int] = []  # each row's slot, in row order
        self.lengths: list[int] = []
        # slot_of on the device, rebuilt as rows join and leave: a copy to the device after a pass
        # would wait for the pass (a copy waits for the work queued before it), and forward reads it then.
        self._rows_at = torch.zeros(0, dtype=torch.long, device=self.device)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def _lay_out(self) -> None:
        """Allocate the cache's tensors at `slots` rows (a static layer takes its shape from its
        first update) with one eager pass, then empty it."""
        if not all(getattr(layer, "is_initialized", False) for layer in self.cache.layers):
            ids = torch.full((self.slots, 1), self.pad_id, dtype=torch.long, device=self.device)
            with torch.inference_mode():  # as every decode runs: its tensors are updated in place there
                self.model(input_ids=ids, **{self._cache_name: self.cache, "use_cache": True})
            self.cache.reset()

    def take(self) -> None:
        """Claim the model's cache for this decode (an empty batch starts it from column 0)."""
        owner = _OWNER.get(self.cache)
        if owner is not None and owner() is not None and owner() is not self and owner().rows:
            raise DsparkError("two batched decodes of one model ran side by side on its static cache "
                              "(captured passes decode one batch at a time); run them one after the other")
        _OWNER[self.cache] = weakref.ref(self)
        if not self.rows:
            self.mask.zero_()
            self._move_to(0)

    def add(self, tokens: list[int]) -> None:
        """A new last row whose cache holds `tokens` (a prompt but its last token), prefilled alone."""
        self.take()
        free = [slot for slot in range(self.slots) if slot not in self.slot_of]
        if not free:
            raise DsparkError(f"a batch of {self.slots} rows cannot take another; please report this")
        if len(tokens) + 1 > self.capacity:
            raise DsparkError(f"a prompt of {len(tokens) + 1} tokens does not fit the static batch's "
                              f"{self.capacity} columns; please report this")
        slot = free[0]
        self.mask[slot] = 0
        if tokens:
            for layer, (keys, values) in zip(self.cache.layers, prefill_alone(self.model, tokens)):
                layer.keys[slot, :, : len(tokens)] = keys[0]
                layer.values[slot, :, : len(tokens)] = values[0]
            self.mask[slot, : len(tokens)] = 1
            if len(tokens) > self.columns:  # the other rows get holes up to where this one ends
                self._move_to(len(tokens))
        self.slot_of.append(slot)
        self.lengths.append(len(tokens))
        self._rows_at = torch.tensor(self.slot_of, dtype=torch.long, device=self.device)

    def remove(self, row: int) -> None:
        self.mask[self.slot_of.pop(row)] = 0
        del self.lengths[row]
        self._rows_at = torch.tensor(self.slot_of, dtype=torch.long, device=self.device)

    def forward(self, feeds: list[list[int]]) -> torch.Tensor:
        """Feed row i the tokens feeds[i] after its own; logits [B, n, vocab], n the longest feed
        (as BatchLM.forward: row i's logits for its feed at positions 0 .. len(feeds[i]) - 1)."""
        self.take()
        n = max(len(feed) for feed in feeds)
        if self.columns + n > self.capacity:
            self._compact()
        if self.columns + n > self.capacity:
            raise DsparkError(f"the static batch's {self.capacity} columns cannot hold its rows; please report this")
        ids = torch.full((self.slots, n), self.pad_id, dtype=torch.long)
        positions = torch.arange(n).repeat(self.slots, 1)
        # A free slot attends to its own new columns: no kernel is handed a row that sees no column.
        # Kernels differ on what such a row gives (this CPU's SDPA: finite values; others NaN), and a NaN
        # key would stay in the slot's columns for its next request, where a mask cannot hide it.
        new = torch.ones(self.slots, n, dtype=torch.long)
        for slot, feed, length in zip(self.slot_of, feeds, self.lengths):
            ids[slot, : len(feed)] = torch.tensor(feed, dtype=torch.long)
            new[slot, len(feed) :] = 0
            positions[slot] += length
        self.mask[:, self.columns : self.columns + n] = new.to(self.device)
        logits = self._call(ids.to(self.device), positions.to(self.device))
        self.columns += n
        self.lengths = [length + len(feed) for length, feed in zip(self.lengths, feeds)]
        return logits[self._rows_at]  # a copy: a graph's next replay overwrites its output

    def _call(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        kwargs = {self._cache_name: self.cache, "use_cache": True, "attention_mask": self.mask,
                  "position_ids": positions, **({"logits_to_keep": 0} if self._can_keep else {})}
        forward = compiled_forward(self.model) if self.compiled else self.model
        return forward(input_ids=ids, **kwargs).logits

    def rollback(self, lengths: list[int]) -> None:
        """Forget each row's tokens from position lengths[row] on (they become holes)."""
        if any(new < old for new, old in zip(lengths, self.lengths)):
            slots = torch.tensor(self.slot_of, dtype=torch.long, device=self.device)
            keep = torch.tensor(lengths, dtype=torch.long, device=self.device)[:, None]
            rows = self.mask[slots]
            self.mask[slots] = rows * (rows.cumsum(1) <= keep)
            self.lengths = [min(new, old) for new, old in zip(lengths, self.lengths)]

    def tidy(self) -> None:
        """Give back the columns past every row's last real one (rows that left, drafts rolled back)."""
        used = self.mask[self.slot_of, : self.columns].any(dim=0).nonzero() if self.rows else []
        end = int(used[-1]) + 1 if len(used) else 0
        if end < self.columns:
            self._move_to(end)

    def _compact(self) -> None:
        """Move every row's real columns to the left end of its slot, in order, in place."""
        width = max(self.lengths, default=0)
        index = torch.zeros(self.slots, width, dtype=torch.long, device=self.device)
        mask = torch.zeros_like(self.mask)
        for slot, length in zip(self.slot_of, self.lengths):
            index[slot, :length] = self.mask[slot, : self.columns].nonzero().flatten()
            mask[slot, :length] = 1
        for layer in self.cache.layers:
            for states in (layer.keys, layer.values):
                b, h, _, d = states.shape
                states[:, :, :width] = states.gather(2, index[:, None, :, None].expand(b, h, width, d))
        self.mask.copy_(mask)
        self._move_to(width)

    def _move_to(self, columns: int) -> None:
        """Set the cache's length to `columns`, in place (its address is a graph's input); nothing
        past it is real to any row."""
        set_length(self.cache, columns)
        self.mask[:, columns:] = 0
        self.columns = columns


@torch.inference_mode()
def warm_batched(model: torch.nn.Module, slots: int, capacity: int, shapes: list[tuple[int, int]],
                 role: str = "target") -> None:
    """Compile (and on CUDA capture) the batched pass for every (tokens fed, _) in `shapes` on the
    model's static cache of `slots` rows and `capacity` columns, as cached_lm.warm_compiled does at
    batch 1 (decode_shapes gives the shapes)."""
    lm = StaticBatchLM(model, slots, capacity, role)
    for _ in range(slots):
        lm.add([0])
    for tokens, _ in shapes:
        for _ in range(3):  # reduce-overhead records its CUDA graph on the third call
            lm.forward([[0] * tokens] * slots)
            lm.rollback([1] * slots)
            lm.tidy()
    for row in reversed(range(slots)):
        lm.remove(row)


def capacity_for(prompts: list[list[int]], max_new_tokens: int, gamma_max: int) -> int:
    """Columns a batched decode of `prompts` needs: its longest row with its answer and a verify
    block, and a quarter more for holes, so that compacting is rare. Captured batches are priced
    at this width too (measure.cost_model.measure_surface's `width`): a static pass attends over every column,
    so a narrower cache would price it cheaper than the decode runs it."""
    longest = max((len(p) for p in prompts), default=1) + max_new_tokens + gamma_max + 2
    return longest + longest // 4


def batch_lm(model: torch.nn.Module, config: DecodeConfig, prompts: list[list[int]], batch_size: int,
             role: str = "target") -> BatchLM | StaticBatchLM:
    """The batched decoder's cache of `model`: static and captured when the config is compiled
    (decoding/capture.py), BatchLM's growing one otherwise."""
    if not config.verification.compiled:
        return BatchLM(model)
    capacity = capacity_for(prompts, config.verification.max_new_tokens, config.stopping.gamma_max)
    return StaticBatchLM(model, max(1, min(batch_size, len(prompts))), capacity, role)
