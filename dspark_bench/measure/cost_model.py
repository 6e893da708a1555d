"""Measuring a cost model: this machine's step costs, timed on the models.

`measure_cost` times `t_draft`, one draft step (and `t_first_draft`, what a round's first costs past
it: `chain_line`), and `t_verify(k)`, one target pass over k + 1 new
positions, each the median of interleaved timings with the caches at a realistic length
(docs/sweeps-and-replay.md); `measure_surface` the same at every batch size B, with B rows in the
batched decoder's own cache (`t_draft(B)`, `t_verify(B, k)`): a cost model over B, what replay
needs to predict a policy at any B; `measure_depths` the passes at other context depths. Each also
times `t_learned`, what the learned signal adds to a draft step of its B rows (`learned_clock`).
The cost models themselves, and the arithmetic replay does with them, are replay/cost.py's.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import torch

from dspark_bench.decoding.batch_lm import BatchLM
from dspark_bench.decoding.cached_lm import CachedLM
from dspark_bench.decoding.confidence import learned_scores, top1, top_count
from dspark_bench.decoding.heads import target_hidden
from dspark_bench.decoding.host import fetch, synchronize
from dspark_bench.decoding.learned_signal import LearnedSignal, feature_names
from dspark_bench.decoding.static_batch_lm import StaticBatchLM
from dspark_bench.depth import PRICED_DEPTHS, priced_depths
from dspark_bench.replay.cost import CostModel, CostSurface, worst_spread

# How many times each pass is timed (medians; harness/plan.prices_seconds counts them): at batch 1,
# at each larger batch size, at each depth, and each prefill.
COST_REPEATS, SURFACE_REPEATS, DEPTH_REPEATS, PREFILL_REPEATS = 15, 7, 9, 5


@torch.inference_mode()
def measure_depths(pair, sequence: list[int], gamma: int, depths, repeats: int = DEPTH_REPEATS,
                   compiled: bool = False) -> dict:
    """`CostModel.by_depth`: the draft step and verify(k) timed with the caches holding the first d
    tokens of `sequence`, and the two models' prefill of those d tokens (seconds per token), for
    each depth d in `depths` that it is long enough for (`compiled`: as measure_cost's)."""
    timed = {}
    for depth in sorted(d for d in set(depths) if gamma + 1 < d <= len(sequence)):
        model = measure_cost(pair, sequence[:depth], gamma, repeats=repeats, compiled=compiled)
        timed[depth] = {"t_draft": model.t_draft, "t_verify": model.t_verify, "t_learned": model.t_learned,
                        **measure_prefill(pair, sequence[:depth])}
    return timed


@torch.inference_mode()
def measure_cost(pair, context: list[int], gamma: int, repeats: int = COST_REPEATS, drafters=("model",),
                 compiled: bool = False) -> CostModel:
    """Median timings with the caches holding `context`, interleaved across k to share drift;
    with "heads" among `drafters`, the heads' pass too. `compiled`: the passes the compiled decoder
    runs (static caches, torch.compile; captured CUDA graphs on CUDA: decoding/capture.py), each
    shape met three times before the clock counts (its graph is recorded on the third call)."""

    capacity = len(context) + gamma + 2
    target = CachedLM(pair.target, compiled, capacity)
    draft = CachedLM(pair.draft, compiled, capacity, role="draft")
    target.prefill(context)
    draft.prefill(context)
    samples = {k: [] for k in range(gamma + 1)}
    chain = [[] for _ in range(max(gamma, 1))]  # a round's draft steps, in turn, each timed right after the last
    filler = context[-gamma - 1 :] * (gamma + 1)

    def clock(lm, tokens):
        synchronize(pair.device)
        start = time.perf_counter()
        lm.forward(tokens, keep=len(tokens))  # the engine reads logits of every verified position
        synchronize(pair.device)
        lm.rollback(len(context))
        return time.perf_counter() - start

    heads_step = heads_clock(pair, context) if "heads" in drafters else None
    if heads_step:
        samples[-2] = []
    learned_step = learned_clock(pair, context, 1, lambda: clock(draft, filler[:1])) if "model" in drafters else None
    learned = []
    warm = 3 if compiled else 2  # the first passes warm up (compiled: compile, then record the graph)
    for _ in range(repeats + warm):
        for step, seconds in zip(chain, drafting(pair, draft, filler[0], len(chain), len(context))):
            step.append(seconds)
        if heads_step:
            samples[-2].append(heads_step())
        if learned_step:
            learned.append(learned_step())
        for k in range(gamma + 1):
            samples[k].append(clock(target, filler[: k + 1]))
    median = {k: statistics.median(v[warm:]) for k, v in samples.items()}
    t_draft, t_first_draft = chain_line([statistics.median(step[warm:]) for step in chain])
    return CostModel(t_draft, [median[k] for k in range(gamma + 1)], len(context), t_heads=median.get(-2, 0.0),
                     spread=worst_spread(v[warm:] for v in [*samples.values(), *chain]),
                     t_learned=max(statistics.median(learned[warm:]), 0.0) if learned else 0.0,
                     t_first_draft=t_first_draft)


def drafting(pair, draft: CachedLM, token: int, steps: int, length: int) -> list[float]:
    """Seconds of each of a round's `steps` draft steps, as a round drafts them right after the
    target's pass: each on the token the last one chose (read on the host, as the decoder reads
    it), the cache growing a position a step; then the cache back at `length`. (Timed alone between
    rollbacks, the later steps sped up faster than a round's: 0.52 against 0.82 ms at the third.)"""
    seconds = []
    for _ in range(steps):
        synchronize(pair.device)
        start = time.perf_counter()
        token = int(draft.forward([token], keep=1)[-1].argmax())
        seconds.append(time.perf_counter() - start)
    draft.rollback(length)
    return seconds


def chain_line(steps: list[float]) -> tuple[float, float]:
    """(t_draft, t_first_draft) from a round's draft steps timed in turn (`steps`, seconds each): s
    steps cost t_first_draft + s * t_draft, the line through the first step's timing that fits the
    later running sums best (least squares over s = 2 .. len(steps)). On a CPU the first steps after
    the target's pass run slow (1.3, 0.95, 0.70, 0.55, 0.50 ms on the shipped pair: the draft's
    weights read back into cache), and pricing every step as the first priced a six-token draft 70 %
    too dear. Through the first step, a batched walk, which prices every draft step as a round's
    first (CostSurface.tables: t_draft + t_first_draft), prices it as timed. Where the line would
    start below 0 (no step dearer than the later ones, as on a GPU), every step at their median."""
    if len(steps) >= 2:
        later = np.cumsum(steps)[1:] - steps[0]  # what the steps after the first add, over s - 1 of them
        s = np.arange(1, len(steps), dtype=np.float64)
        slope = float(s @ later / (s @ s))
        if 0 < slope < steps[0]:
            return slope, float(steps[0] - slope)
    return float(statistics.median(steps)), 0.0


def heads_clock(pair, context: list[int]):
    """A timer of one pass of every head over the target's hidden state after `context`."""

    hidden = target_hidden(pair.target, torch.tensor([context], device=pair.device))[0, -1]

    def clock() -> float:
        synchronize(pair.device)
        start = time.perf_counter()
        pair.heads(hidden).argmax(-1)
        synchronize(pair.device)
        return time.perf_counter() - start

    return clock


LEARNED_POSITIONS = 8  # the timed fit's draft positions (any: a position is one lookup)


def learned_clock(pair, context: list[int], rows: int, forward):
    """A timer of what the learned signal adds to one draft step of `rows` rows after `context`:
    the engine's work for it (confidence.draft_signals' top-k, the read, host_scores with each
    row's context copied as the engines copy it) less a raw metric's (its signal and the read),
    each timed right after a draft forward (`forward()`, untimed), as the engines run them: the
    first work after a forward runs slower, and both must pay that alike. The fit is zeros of
    the right shape: its coefficients do not change its cost."""
    vocab = pair.draft.get_output_embeddings().weight.shape[0]
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)).to(pair.device)
    probs = torch.softmax(logits * 3, dim=-1)
    tokens = probs.argmax(dim=-1)
    n = len(feature_names(LEARNED_POSITIONS))
    signal = LearnedSignal((0.0,) * n, (1.0,) * n, (0.0,) * n, 0.0, LEARNED_POSITIONS)

    def timed(work) -> float:
        forward()
        synchronize(pair.device)
        start = time.perf_counter()
        work()
        return time.perf_counter() - start

    def learned_step():
        read, ids = fetch(probs.topk(top_count(signal.topk, vocab), dim=-1).values, tokens)
        learned_scores(signal, read, [context + [] for _ in range(rows)], ids, [0] * rows)

    return lambda: timed(learned_step) - timed(lambda: fetch(top1(probs)[..., None], tokens))


def batch_of(pair, context: list[int], rows: int, contexts: list[list[int]] | None = None,
             compiled: bool = False, gamma: int = 8, width: int = 0
             ) -> tuple[BatchLM | StaticBatchLM, BatchLM | StaticBatchLM, list[int]]:
    """Target and draft caches of `rows` rows, and the rows' lengths. Each row holds `context` cut
    to a different length, as a real batch's rows differ (left holes in the cache, so a pass runs
    the masked attention the batched decoder runs: equal rows would take a faster unmasked path); or, given
    `contexts`, row r holds contexts[r mod their number], so that the batch is as wide as one of
    those requests' (its longest row sets every pass's width). `compiled`: the captured decoder's
    static caches (static_batch_lm.py) of `width` columns, or what a verify of `gamma` needs."""
    if contexts:
        chosen = [contexts[row % len(contexts)] for row in range(rows)]
    else:
        spread = max(1, min(32, len(context) // 2))  # a short context still leaves every row tokens
        chosen = [context[: len(context) - (row * 7) % spread] for row in range(rows)]
    if compiled:
        width = max(width, max(map(len, chosen)) + gamma + 2)
        target, draft = StaticBatchLM(pair.target, rows, width), StaticBatchLM(pair.draft, rows, width, role="draft")
    else:
        target, draft = BatchLM(pair.target), BatchLM(pair.draft)
    for row in chosen:
        target.add(row)
        draft.add(row)
    return target, draft, [len(row) for row in chosen]


def halfway(rec, ids: list[list[int]]) -> list[list[int]]:
    """Each prompt halfway through its recorded output (a sampled record's first path), in a fixed
    shuffled order: the rows a batch of the cost model over B holds, so that its width is a real batch's."""
    paths = (rec.info.get("sampling") or {}).get("paths", 1)
    order = np.random.default_rng(0).permutation(len(ids))
    return [ids[p] + rec.continuation[p * paths, : int(rec.lengths[p * paths]) // 2].tolist() for p in order]


def time_pass(pair, lm: BatchLM | StaticBatchLM, tokens: list[int], lengths: list[int]) -> float:
    """Seconds of one pass feeding every row `tokens`, with the cache upkeep after it (rolled back)."""
    synchronize(pair.device)
    start = time.perf_counter()
    lm.forward([tokens] * len(lengths))
    synchronize(pair.device)
    lm.rollback(lengths)
    lm.tidy()
    return time.perf_counter() - start


@torch.inference_mode()
def measure_surface(pair, context: list[int], gamma: int, batch_sizes, repeats: int = SURFACE_REPEATS,
                    drafters=("model",), contexts: list[list[int]] | None = None,
                    compiled: bool = False, width: int = 0) -> CostSurface:
    """t_draft(B) and t_verify(B, k) for every B (and 1): B rows holding `context` (or, given
    `contexts`, those in turn: `batch_of`), timed through the batched decoder's own cache (BatchLM),
    k interleaved to share drift. B = 1 is `measure_cost`. `compiled`: the compiled passes at
    every B (static caches; CUDA graphs on CUDA), what a decode runs there by default, B > 1 on
    caches of `width` columns (static_batch_lm.capacity_for of the decodes priced)."""

    models = {1: dataclasses.replace(measure_cost(pair, context, gamma, drafters=drafters, compiled=compiled),
                                     **measure_prefill(pair, context))}
    for b in sorted(set(batch_sizes) - {1}):
        models[b] = time_batch(pair, context, gamma, b, repeats, drafters, contexts, compiled, width)
    return CostSurface(models)


def time_batch(pair, context: list[int], gamma: int, rows: int, repeats: int, drafters=("model",),
               contexts: list[list[int]] | None = None, compiled: bool = False, width: int = 0) -> CostModel:
    """One batch size's CostModel of `measure_surface` (with the learned signal's cost where the
    draft model is among `drafters`)."""
    target, draft, lengths = batch_of(pair, context, rows, contexts, compiled, gamma, width)
    filler = context[-gamma - 1 :] * (gamma + 1)
    samples = {k: [] for k in range(-1, gamma + 1)}
    learned_step = (learned_clock(pair, context, rows, lambda: time_pass(pair, draft, filler[:1], lengths))
                    if "model" in drafters else None)
    learned = []
    warm = 3 if compiled else 1  # the first passes warm up (compiled: compile, then record the graph)
    for _ in range(repeats + warm):
        samples[-1].append(time_pass(pair, draft, filler[:1], lengths))
        if learned_step:
            learned.append(learned_step())
        for k in range(gamma + 1):
            samples[k].append(time_pass(pair, target, filler[: k + 1], lengths))
    median = {k: statistics.median(v[warm:]) for k, v in samples.items()}
    return CostModel(median[-1], [median[k] for k in range(gamma + 1)], max(lengths), rows,
                     spread=worst_spread(v[warm:] for v in samples.values()),
                     t_learned=max(statistics.median(learned[warm:]), 0.0) if learned else 0.0)


@torch.inference_mode()
def measure_surface_depths(pair, sequence: list[int], gamma: int, batch_sizes, depths, repeats: int = SURFACE_REPEATS,
                           compiled: bool = False, width: int = 0) -> dict[int, dict]:
    """Each B > 1's `CostModel.by_depth` (docs/depth.md#at-every-batch-size-and-under-load): the draft
    step, verify(k) and what the learned signal adds to a draft step (its lookup reads each row's
    whole context) of B rows whose widest holds the first d tokens of `sequence` (the others a few
    tokens fewer, as `batch_of` cuts them), for each depth d of `depths` it is long enough for: what
    replay/step_prices.py prices a step at its rows' depths with."""
    timed = {}
    for b in sorted(set(batch_sizes) - {1}):
        timed[b] = {}
        for depth in sorted(d for d in set(depths) if gamma + 1 < d <= len(sequence)):
            model = time_batch(pair, sequence[:depth], gamma, b, repeats, ("model",), None, compiled, width)
            timed[b][depth] = {"t_draft": model.t_draft, "t_verify": model.t_verify, "t_learned": model.t_learned}
    return timed


def time_prefill(pair, model, context: list[int]) -> float:
    """Seconds of a batch-1 prefill of `context`."""
    synchronize(pair.device)
    start = time.perf_counter()
    CachedLM(model).prefill(context)
    synchronize(pair.device)
    return time.perf_counter() - start


def measure_prefill(pair, context: list[int], repeats: int = PREFILL_REPEATS) -> dict:
    """Seconds per prompt token of a batch-1 prefill of `context`, target and draft (medians)."""

    times = {name: [] for name in ("target", "draft")}
    for _ in range(repeats + 1):  # the first pass warms up
        times["target"].append(time_prefill(pair, pair.target, context))
        times["draft"].append(time_prefill(pair, pair.draft, context))
    return {f"t_prefill_{name}": statistics.median(t[1:]) / len(context) for name, t in times.items()}


def torch_version() -> str:
    """What ran our decoder's passes, as its cost-model file names it (replay/cost_file.py's `ours`)."""
    return f"torch {torch.__version__}"


def depths_to_price(pair, ids: list[list[int]], max_new_tokens: int) -> tuple[int, ...]:
    """The depths our passes are timed at (depth.priced_depths): none where every prompt fits the
    first depth bucket, the priced depths up to the deepest round's otherwise."""
    if max(len(i) for i in ids) <= PRICED_DEPTHS[0]:
        return ()
    trained = getattr(pair.target.config, "max_position_embeddings", None)
    return priced_depths(max(len(i) for i in ids) + max_new_tokens, trained)


def time_depths(pair, rec, ids: list[list[int]], surface, gamma: int, compiled: bool, width: int,
                progress=None) -> None:
    """Where prompts (`ids`) reach past the first depth bucket's edge, our passes timed at depth
    (depth.PRICED_DEPTHS) into `surface`'s models (CostModel.by_depth): batch 1's with its prefills,
    each larger batch size's at the depths below its own widest row, with its own timing (its rows
    the prompts' own, halfway through) the depth point at that row's length. A batch is not timed
    deeper than its rows reach: on long-code 8 rows of 4,096 tokens cost 3x 8 rows of 2,048 here,
    where the workload's own rows (the widest 3,244) cost 1.26x, about what the live batch paid; a
    line through the deeper point priced B = 8's plain decoding at 1.56x its measured time
    (docs/depth.md#at-every-batch-size-and-under-load)."""
    depths = depths_to_price(pair, ids, rec.max_new_tokens)
    if not depths:
        return
    if progress:
        progress(f"timing the cost model at depths {', '.join(map(str, depths))}", 0, 1)
    sequence = timing_sequence(rec, ids, depths[-1])
    surface.models[1].by_depth = measure_depths(pair, sequence, gamma, depths, compiled=compiled)
    for b, model in sorted(surface.models.items()):
        if b > 1:
            below = [d for d in depths if d < model.context_tokens]
            timed = measure_surface_depths(pair, sequence, gamma, [b], below, compiled=compiled, width=width)[b]
            own = {model.context_tokens: {"t_draft": model.t_draft, "t_verify": list(model.t_verify)}}
            surface.models[b] = dataclasses.replace(model, by_depth={**timed, **own})


def timing_sequence(rec, ids: list[list[int]], length: int) -> list[int]:
    """The context our passes are timed in at each depth, `length` tokens of real text (attention
    then reads what it reads in decoding): the longest prompt and the record's continuation of it,
    then the other prompts and theirs, as far as it takes."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    sequence: list[int] = []
    for p in order:
        sequence += list(ids[p]) + rec.continuation[p, : int(rec.lengths[p])].tolist()
        if len(sequence) >= length:
            break
    return sequence[:length]
