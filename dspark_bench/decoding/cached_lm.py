"""A causal LM with its own KV cache, fed tokens directly (no `generate`).

`length` counts the tokens in the cache; `rollback` crops it — the one place where rejected
tokens leave a cache. Positions follow from the cache length, so nothing else needs fixing.

Compiled (`DecodeConfig.compiled`, `--compile`): the cache is a transformers `StaticCache`
(preallocated, fixed addresses, its length a device tensor, so positions never force a
recompile) and every forward but the prefill — a draft step, a verify block, a baseline step —
runs through `torch.compile` of the model's forward; on CUDA in "reduce-overhead" mode, which
captures one CUDA graph per input length (1 and 2 for the draft, 1 to gamma_max + 1 for the
target). A prefill runs eagerly: its length changes with every prompt. `warm_compiled` meets
every length before a clock runs.
"""

from __future__ import annotations

import inspect
import weakref

import torch
from transformers import DynamicCache, StaticCache

from dspark_bench.decoding.types import PassClock
from dspark_bench.errors import DsparkError

# torch.compile options; tests swap in dynamo's "eager" backend to check the wiring without code generation.
COMPILE_OPTIONS: dict = {}


def forward_kwargs(model) -> tuple[str, bool]:
    """(the name `model.forward` takes its cache by, whether it takes `logits_to_keep`): transformers 5
    renamed `past_key_values` to `cache`, older models and remote code still use the old name;
    `logits_to_keep` saves the LM head over positions we do not read."""
    params = inspect.signature(model.forward).parameters
    cache_name = "cache" if "cache" in params else "past_key_values"
    return cache_name, "logits_to_keep" in params


class CachedLM:
    def __init__(self, model: torch.nn.Module, compiled: bool = False, capacity: int = 0, role: str = "target",
                 hidden: bool = False, clock: PassClock | None = None):
        """`capacity`: the most tokens this decode will hold (compiled: the static cache's size);
        `role`: whose static cache it takes (a model drafting for itself holds two); `hidden`:
        keep the last hidden states of each forward's kept positions too (`self.hidden`, the
        heads drafter's input); `clock`: times every pass (in-decode costs: measure/pass_clock.py),
        None for none."""
        self.model = model
        self.clock = clock
        self.role = role
        self.keep_hidden = hidden
        self.hidden: torch.Tensor | None = None  # [keep, hidden] of the last forward, if kept
        self.device = next(model.parameters()).device
        self.compiled = compiled
        self.cache = static_cache(model, capacity, role) if compiled else DynamicCache()
        self.length = 0
        self._cache_name, self._can_keep = forward_kwargs(model)

    def forward(self, tokens: list[int] | torch.Tensor, keep: int = 1, eager: bool = False) -> torch.Tensor:
        """Feed `tokens` after the cached ones; logits of the last `keep` positions [keep, vocab].

        `tokens` may be a tensor already on the device (drafted ids): no copy from the host."""
        if isinstance(tokens, torch.Tensor):
            ids = tokens.view(1, -1)
        else:
            ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        kwargs = {self._cache_name: self.cache, "use_cache": True}
        if self._can_keep:
            kwargs["logits_to_keep"] = keep
        if self.clock is None:
            return self._forward(ids, keep, eager, kwargs)
        start = self.clock.before_pass()
        logits = self._forward(ids, keep, eager, kwargs)
        self.clock.after_pass(start, self.role, ids.shape[1])
        return logits

    def _forward(self, ids: torch.Tensor, keep: int, eager: bool, kwargs: dict) -> torch.Tensor:
        if self.keep_hidden:
            out = self.model(input_ids=ids, output_hidden_states=True, **kwargs)
            self.hidden = out.hidden_states[-1][0, -keep:]
            self.length += ids.shape[1]
            return out.logits[0, -keep:]
        if self.compiled and not eager and self.cache.is_initialized:  # a cache is laid out eagerly
            # A CUDA graph's outputs live in memory its next replay overwrites: keep a copy.
            logits = compiled_forward(self.model)(input_ids=ids, **kwargs).logits[0, -keep:].clone()
        else:
            logits = self.model(input_ids=ids, **kwargs).logits[0, -keep:]
        self.length += ids.shape[1]
        return logits

    def prefill(self, tokens: list[int]) -> None:
        if tokens:
            self.forward(tokens, keep=1, eager=True)

    def rollback(self, length: int) -> None:
        """Forget every cached token from position `length` on."""
        if length < self.length:
            if self.compiled:
                move_back(self.cache, self.length - length)
            else:
                # A negative argument removes that many tokens, in transformers 4.x and 5.x alike.
                self.cache.crop(length - self.length)
            self.length = length


def move_back(cache: StaticCache, tokens: int) -> None:
    """Roll a static cache back by `tokens`: each layer's length moves back in place (its address
    is a CUDA graph's input); the stale slots are overwritten next. What `StaticLayer.crop` does
    where it exists: the static layers of transformers 5.17 have none (found on the H200 run,
    docs/gpu.md), so this does not call it."""
    for layer in cache.layers:
        if isinstance(layer.cumulative_length, torch.Tensor):
            layer.cumulative_length.sub_(tokens)
        else:
            layer.cumulative_length -= tokens


def set_length(cache: StaticCache, tokens: int) -> None:
    """Set a static cache's length to `tokens` in place (static_batch_lm.py moves it both ways);
    as in move_back, a layer counts in a device tensor, or in an int in older transformers."""
    for layer in cache.layers:
        if isinstance(layer.cumulative_length, torch.Tensor):
            layer.cumulative_length.fill_(tokens)
        else:
            layer.cumulative_length = tokens


# One static cache per (model, role) and one compiled forward per model, reused by every decode:
# a new cache (new addresses) or a new compiled function would compile and capture again.
_STATIC: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(role, rows): (cache, size)}
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def static_cache(model: torch.nn.Module, capacity: int, role: str = "target", rows: int = 1,
                 empty: bool = True) -> StaticCache:
    """The model's static cache for `role` (and `rows` rows: the batched decoder's,
    static_batch_lm.py), holding at least `capacity` tokens; emptied unless `empty` is False (a
    batched decode empties it when it takes it: another may still be using it)."""
    caches = _STATIC.setdefault(model, {})
    cache, size = caches.get((role, rows), (None, 0))
    if cache is None or size < capacity:
        size = -(-max(capacity, 1) // 256) * 256  # grow in steps, so most decodes reuse it
        why = static_blocker(model)
        if why:
            raise DsparkError(f"--compile needs a static KV cache, not possible with {why}; run without --compile")
        cache = StaticCache(config=model.config, max_cache_len=size)
        caches[role, rows] = (cache, size)
    if empty:
        cache.reset()  # back to empty on the device (lengths to 0); the old entries are overwritten
    return cache


_BLOCKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> static_blocker's answer


def static_blocker(model: torch.nn.Module) -> str | None:
    """Why this model's cache cannot be a static one rolled back by length (None: it can); asked
    once per model (a sweep asks for every policy)."""
    if model not in _BLOCKERS:
        _BLOCKERS[model] = _static_blocker(model)
    return _BLOCKERS[model]


def _static_blocker(model: torch.nn.Module) -> str | None:
    try:
        layers = StaticCache(config=model.config, max_cache_len=1).layers  # layers allocate at first use
    except Exception as error:  # a model transformers cannot give a static cache (remote code, no attention)
        return f"a model without a static cache ({type(error).__name__}: {error})"
    if any(getattr(layer, "is_sliding", False) for layer in layers):
        return "sliding-window attention layers"
    if any(not hasattr(layer, "cumulative_length") for layer in layers):
        return "transformers below 5 (its static cache cannot be rolled back by length)"
    return None


def compiled_forward(model: torch.nn.Module):
    compiled = _COMPILED.get(model)
    if compiled is None:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)  # one graph per length
        mode = "reduce-overhead" if next(model.parameters()).device.type == "cuda" else None
        # dynamic=None: the first length compiles static, a second one compiles a graph generic in
        # length that every later length reuses (on CUDA, each length still gets its own graph capture).
        options = {"mode": mode, "dynamic": None, **COMPILE_OPTIONS}
        compiled = _COMPILED[model] = torch.compile(model.forward, **options)
    return compiled


@torch.inference_mode()
def warm_compiled(model: torch.nn.Module, shapes: list[tuple[int, int]], capacity: int, role: str = "target") -> None:
    """Compile (and on CUDA capture) the step for every (tokens fed, logits kept) in `shapes`, on
    a static cache of `capacity` tokens: the run's longest decode, so no later one reallocates."""
    lm = CachedLM(model, compiled=True, capacity=capacity, role=role)
    lm.prefill([0, 0])  # lays the cache out eagerly
    lm.rollback(0)
    for tokens, keep in shapes:
        for _ in range(3):  # reduce-overhead records its CUDA graph on the third call
            lm.forward([0] * tokens, keep)
            lm.rollback(0)


def decode_shapes(gamma_max: int) -> dict[str, list[tuple[int, int]]]:
    """What a compiled decode feeds each model: the target one token (baseline) or a verify block
    of up to gamma_max drafted tokens after one; the draft one token, or two when it catches up."""
    return {"target": [(n, n) for n in range(1, gamma_max + 2)], "draft": [(1, 1), (2, 1)]}


def unseen(recent: torch.Tensor, seq: list[int], lm: CachedLM) -> torch.Tensor:
    """The tokens of `seq` past `lm`'s cache, as a view of `recent` (seq's tail on the device)."""
    count = len(seq) - lm.length
    if not 0 < count <= len(recent):
        raise DsparkError(f"the decoder lost track of its cache ({count} unseen tokens); please report this")
    return recent[len(recent) - count :]
