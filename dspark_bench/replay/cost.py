"""The cost model: this machine's step costs, measured, and the speedup they predict.

`t_draft` is one draft step and `t_verify(k)` one target pass over k + 1 new positions, each
the median of interleaved timings with the caches at a realistic length (docs/sweeps-and-replay.md). The cost
surface holds one such model per batch size B, timed with B rows in the batched decoder's own
cache (`t_draft(B)`, `t_verify(B, k)`): what replay needs to predict a policy at any B. Each
model also holds `t_learned`, what the learned signal adds to a draft step of its B rows (it runs
on the host), which replay charges to the learned policies' draft steps.

Layouts: a padded pass over B rows costs t_verify(B, longest draft). A packed pass (each row
verifies only its own tokens, as vLLM, SGLang and TensorRT-LLM do) costs what its total token
count costs: the padded pass over B rows holding the same number of tokens spread evenly,
t_verify(B, total / B - 1), interpolated between whole k. The batched decoder here runs padded
only; packed speedups are predictions and are labelled so wherever they appear.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from dspark_bench.decoding.batch_lm import BatchLM
from dspark_bench.decoding.budget import cost_tables
from dspark_bench.decoding.cached_lm import CachedLM
from dspark_bench.decoding.confidence import learned_scores, top1, top_count
from dspark_bench.decoding.heads import target_hidden
from dspark_bench.decoding.host import fetch, synchronize
from dspark_bench.decoding.learned_signal import LearnedSignal, feature_names
from dspark_bench.decoding.static_batch_lm import StaticBatchLM
from dspark_bench.decoding.types import Round


@dataclass
class CostModel:
    """Measured seconds: one draft step, and one target pass over k + 1 new positions."""

    t_draft: float
    t_verify: list[float]  # index k = 0 .. gamma: draft length verified
    context_tokens: int  # cache length the timings were taken at
    batch_size: int = 1  # rows in each timed pass
    # Seconds per prompt token of one request's prefill (batch 1), target and draft: a request
    # joining a running batch pays it (cost surface only; batch-1 replay leaves prefill out).
    t_prefill_target: float = 0.0
    t_prefill_draft: float = 0.0
    t_heads: float = 0.0  # one pass of the target's heads over a hidden state (the heads drafter's round)
    # The worst relative IQR (IQR / median) of the repeats behind any median above: how far the
    # timings disagreed (harness.health grades it).
    spread: float = 0.0
    # What the learned signal adds to a draft step over a raw metric: all five signals, the read,
    # the lookup's agreement of every row and the fit, on the host (`learned_clock`). A learned
    # policy's draft step costs t_draft + t_learned (0 in cost models older than it).
    t_learned: float = 0.0
    # A serving engine's costs past its passes (docs/engines-and-export.md#cost-model-files):
    # `t_round`, what each speculative round adds beyond its draft steps and its verify pass
    # (sampling every verified position, acceptance, cache edits, scheduling); `t_plain`, plain
    # decoding's seconds per token where that is more than one 1-token pass (its own sampling and
    # scheduling). Our decoder's timings leave both at 0: a plain step is t_verify(0).
    t_round: float = 0.0
    t_plain: float = 0.0
    # What a round whose draft came back empty adds (llama.cpp's p-min can stop a draft before its
    # first token): llama-server then takes a plain step (the sampled token alone, sampled once,
    # no verification or checkpoint: server-context.cpp, `if (!draft.empty())`), so it costs less
    # than t_round. None: the same as t_round (engines whose drafts are never empty).
    t_round_empty: float | None = None
    # The same passes timed at other context depths (docs/depth.md): context tokens -> {"t_draft": s,
    # "t_verify": [s, ...]}. A round is priced at its own depth (`at_depths`); empty: every round at
    # context_tokens, as cost models were before depth had an axis.
    by_depth: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if self.by_depth:  # JSON keys are strings; a model without the axis is written as before it
            data["by_depth"] = {str(d): entry for d, entry in sorted(self.by_depth.items())}
        else:
            del data["by_depth"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        return cls(float(data["t_draft"]), [float(t) for t in data["t_verify"]], int(data["context_tokens"]),
                   int(data.get("batch_size", 1)), float(data.get("t_prefill_target", 0.0)),
                   float(data.get("t_prefill_draft", 0.0)), float(data.get("t_heads", 0.0)),
                   float(data.get("spread", 0.0)), float(data.get("t_learned", 0.0)), float(data.get("t_round", 0.0)),
                   float(data.get("t_plain", 0.0)),
                   None if data.get("t_round_empty") is None else float(data["t_round_empty"]),
                   {int(d): {"t_draft": float(e["t_draft"]), "t_verify": [float(t) for t in e["t_verify"]]}
                    for d, e in data.get("by_depth", {}).items()})

    def at_depths(self, depths) -> tuple[np.ndarray, np.ndarray]:
        """(t_draft [n], round costs [n, k]: `round_costs` at each depth in `depths`): linear in depth
        between the two nearest timed depths, flat below the shallowest, and extrapolated along the
        deepest two beyond the deepest (a KV-cache read grows linearly with its length). Without a
        depth axis, every depth costs what context_tokens did."""
        depths = np.asarray(depths, dtype=np.float64)
        extra = np.asarray(self.round_costs()) - np.asarray(self.t_verify)  # t_round: not a pass, no depth
        if not self.by_depth:
            return np.full(depths.shape, self.t_draft), np.broadcast_to(self.round_costs(), (*depths.shape, len(extra)))
        timed = sorted(self.by_depth.items())
        at = np.array([d for d, _ in timed], dtype=np.float64)
        draft = np.array([e["t_draft"] for _, e in timed])
        verify = np.array([e["t_verify"][: len(extra)] for _, e in timed])
        if len(at) == 1:
            return np.full(depths.shape, draft[0]), np.broadcast_to(verify[0] + extra, (*depths.shape, len(extra)))
        lo, hi, w = _between(at, depths)
        w = w[..., None]
        return ((1 - w[..., 0]) * draft[lo] + w[..., 0] * draft[hi],
                (1 - w) * verify[lo] + w * verify[hi] + extra)

    def prefills(self, prompt_tokens) -> tuple[np.ndarray, np.ndarray]:
        """(target, draft) seconds of each prompt's prefill, where the depth axis timed them: n tokens
        at the per-token cost of a prefill that long (interpolated as `at_depths`); zeros otherwise.
        A measured speedup includes both sides' prefills, which a long prompt makes a large share."""
        n = np.asarray(prompt_tokens, dtype=np.float64)
        timed = sorted((d, e) for d, e in self.by_depth.items() if "t_prefill_target" in e)
        if not timed:
            return np.zeros(n.shape), np.zeros(n.shape)
        at = np.array([d for d, _ in timed], dtype=np.float64)
        per_token = {role: np.array([e[f"t_prefill_{role}"] for _, e in timed]) for role in ("target", "draft")}
        if len(at) == 1:
            return n * per_token["target"][0], n * per_token["draft"][0]
        lo, hi, w = _between(at, n)
        return tuple(n * ((1 - w) * per_token[role][lo] + w * per_token[role][hi]) for role in ("target", "draft"))

    @property
    def plain_step(self) -> float:
        """Plain decoding's seconds per token: t_plain where measured, else one 1-token pass."""
        return self.t_plain or self.t_verify[0]

    def draft_step(self, drafter: str, learned: bool = False) -> float:
        """What one of `drafter`'s draft forwards costs (Round.draft_forwards counts them): a draft
        model step (`learned`: scored by the learned signal), the heads' pass; lookup runs none
        (its search on the host is not priced)."""
        return {"model": self.t_draft + (self.t_learned if learned else 0.0), "heads": self.t_heads,
                "lookup": 0.0}[drafter]

    def round_costs(self) -> list[float]:
        """Index k: one round's cost past its draft steps, a draft of k tokens: t_verify(k) and
        what the engine adds per round (t_round; t_round_empty where k = 0)."""
        empty = self.t_round if self.t_round_empty is None else self.t_round_empty
        return [t + (self.t_round if k else empty) for k, t in enumerate(self.t_verify)]

    def predict(self, rounds: list[Round], tokens: int) -> float:
        """docs/sweeps-and-replay.md: N * t_plain / sum over rounds of (s_r * t_draft + t_verify(L_r) + t_round),
        t_round_empty in place of t_round where L_r = 0."""
        costs = self.round_costs()
        spent = sum(r.draft_forwards * self.t_draft + costs[r.drafted] for r in rounds)  # a draft model's
        return self.speedup(tokens, spent)

    def speedup(self, tokens, predicted_time):
        """The predicted speedup of `tokens` generated in `predicted_time` cost-model seconds
        (numbers or arrays): plain decoding's seconds per token (`plain_step`) over the policy's
        own, predicted_time / tokens; the same per-token ratio as a measured speedup."""
        return tokens * self.plain_step / predicted_time


def _between(at: np.ndarray, depths: np.ndarray):
    """(lower index, upper index, weight) of each depth between timed depths `at` (sorted, ≥ 2):
    flat below the first, extrapolated along the last two beyond the last."""
    hi = np.clip(np.searchsorted(at, depths), 1, len(at) - 1)
    lo = hi - 1
    return lo, hi, np.maximum((depths - at[lo]) / (at[hi] - at[lo]), 0.0)


@torch.inference_mode()
def measure_depths(pair, sequence: list[int], gamma: int, depths, repeats: int = 9, compiled: bool = False) -> dict:
    """`CostModel.by_depth`: the draft step and verify(k) timed with the caches holding the first d
    tokens of `sequence`, and the two models' prefill of those d tokens (seconds per token), for
    each depth d in `depths` that it is long enough for (`compiled`: as measure_cost's)."""
    timed = {}
    for depth in sorted(d for d in set(depths) if gamma + 1 < d <= len(sequence)):
        model = measure_cost(pair, sequence[:depth], gamma, repeats=repeats, compiled=compiled)
        timed[depth] = {"t_draft": model.t_draft, "t_verify": model.t_verify,
                        **measure_prefill(pair, sequence[:depth])}
    return timed


@torch.inference_mode()
def measure_cost(pair, context: list[int], gamma: int, repeats: int = 15, drafters=("model",),
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
    samples = {k: [] for k in range(-1, gamma + 1)}  # -1: the draft step
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
        samples[-1].append(clock(draft, filler[:1]))
        if heads_step:
            samples[-2].append(heads_step())
        if learned_step:
            learned.append(learned_step())
        for k in range(gamma + 1):
            samples[k].append(clock(target, filler[: k + 1]))
    median = {k: statistics.median(v[warm:]) for k, v in samples.items()}
    return CostModel(median[-1], [median[k] for k in range(gamma + 1)], len(context), t_heads=median.get(-2, 0.0),
                     spread=worst_spread(v[warm:] for v in samples.values()),
                     t_learned=max(statistics.median(learned[warm:]), 0.0) if learned else 0.0)


def relative_iqr(values) -> float:
    """Interquartile range over median: how far repeats of one timing disagree."""
    q1, median, q3 = np.percentile(np.asarray(values, float), [25, 50, 75])
    return float((q3 - q1) / median) if median > 0 else float("inf")


def worst_spread(repeats) -> float:
    """The largest relative IQR over groups of repeated timings."""
    return max((relative_iqr(values) for values in repeats), default=0.0)


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


@dataclass
class CostSurface:
    """One CostModel per measured batch size; `tables` fills every B in between."""

    models: dict[int, CostModel]

    def to_dict(self) -> dict:
        return {"batch_sizes": {str(b): m.to_dict() for b, m in sorted(self.models.items())}}

    @classmethod
    def from_dict(cls, data: dict) -> "CostSurface":
        return cls({int(b): CostModel.from_dict(m) for b, m in data["batch_sizes"].items()})

    def at(self, batch_size: int) -> CostModel:
        return self.models[batch_size]

    def tables(self, batch_size: int, learned: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(t_draft[b], t_verify[b, k]) for b = 0 .. batch_size rows (a draining batch has fewer),
        linear in b between the measured batch sizes, non-decreasing in b and k; row 0 is unused.
        `learned`: a draft step scored by the learned signal (t_draft + t_learned)."""
        return cost_tables({b: (m.t_draft + (m.t_learned if learned else 0.0), m.t_verify)
                            for b, m in self.models.items()}, batch_size)


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
    shuffled order: the rows a batch of the surface holds, so that its width is a real batch's."""
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
def measure_surface(pair, context: list[int], gamma: int, batch_sizes, repeats: int = 7,
                    drafters=("model",), contexts: list[list[int]] | None = None,
                    compiled: bool = False, width: int = 0) -> CostSurface:
    """t_draft(B) and t_verify(B, k) for every B (and 1): B rows holding `context` (or, given
    `contexts`, those in turn: `batch_of`), timed through the batched decoder's own cache (BatchLM),
    k interleaved to share drift. B = 1 is `measure_cost`. `compiled`: the compiled passes at
    every B (static caches; CUDA graphs on CUDA), what a decode runs there by default, B > 1 on
    caches of `width` columns (static_batch_lm.capacity_for of the decodes priced)."""

    models = {1: dataclasses.replace(measure_cost(pair, context, gamma, drafters=drafters, compiled=compiled),
                                     **measure_prefill(pair, context))}
    filler = context[-gamma - 1 :] * (gamma + 1)
    for b in sorted(set(batch_sizes) - {1}):
        target, draft, lengths = batch_of(pair, context, b, contexts, compiled, gamma, width)
        samples = {k: [] for k in range(-1, gamma + 1)}
        learned_step = (learned_clock(pair, context, b, lambda: time_pass(pair, draft, filler[:1], lengths))
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
        models[b] = CostModel(median[-1], [median[k] for k in range(gamma + 1)], max(lengths), b,
                              spread=worst_spread(v[warm:] for v in samples.values()),
                              t_learned=max(statistics.median(learned[warm:]), 0.0) if learned else 0.0)
    return CostSurface(models)


def time_prefill(pair, model, context: list[int]) -> float:
    """Seconds of a batch-1 prefill of `context`."""
    synchronize(pair.device)
    start = time.perf_counter()
    CachedLM(model).prefill(context)
    synchronize(pair.device)
    return time.perf_counter() - start


def measure_prefill(pair, context: list[int], repeats: int = 5) -> dict:
    """Seconds per prompt token of a batch-1 prefill of `context`, target and draft (medians)."""

    times = {name: [] for name in ("target", "draft")}
    for _ in range(repeats + 1):  # the first pass warms up
        times["target"].append(time_prefill(pair, pair.target, context))
        times["draft"].append(time_prefill(pair, pair.draft, context))
    return {f"t_prefill_{name}": statistics.median(t[1:]) / len(context) for name, t in times.items()}
