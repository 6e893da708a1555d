"""The cost model: what each pass costs on a machine, and the speedup it predicts.

`t_draft` is one draft step and `t_verify(k)` one target pass over k + 1 new positions (measured
by measure/cost_model.py, or read from an engine's cost-model file: `cost_file`). A cost model
over B (`CostSurface`) holds one cost model per batch size B, timed with B rows in the batched
decoder's own cache (`t_draft(B)`, `t_verify(B, k)`): what replay needs to predict a policy at
any B. Each cost model also holds `t_learned`, what the learned signal adds to a draft step of
its B rows (it runs on the host), which replay charges to the learned policies' draft steps.

Layouts: a padded pass over B rows costs t_verify(B, longest draft). A packed pass (each row
verifies only its own tokens, as vLLM, SGLang and TensorRT-LLM do) costs what its total token
count costs: the padded pass over B rows holding the same number of tokens spread evenly,
t_verify(B, total / B - 1), interpolated between whole k. The batched decoder here runs padded
only; packed speedups are predictions and are labelled so wherever they appear.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from dspark_bench.decoding.budget import cost_tables
from dspark_bench.decoding.types import Round


@dataclass
class CostModel:
    """Measured seconds: one draft step, and one target pass over k + 1 new positions."""

    t_draft: float
    t_verify: list[float]  # index k = 0 .. gamma: draft length verified
    context_tokens: int  # cache length the timings were taken at
    batch_size: int = 1  # rows in each timed pass
    # Seconds per prompt token of one request's prefill (batch 1), target and draft: a request
    # joining a running batch pays it (a cost model over B only; batch-1 replay leaves prefill out).
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
    # scheduling). Our decoder's prices timed inside decodes set both (measure/in_decode.py); its
    # isolated passes (`--isolated-prices`) leave them at 0: a plain step is then t_verify(0).
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
    # What a round's first draft-model step costs past t_draft, once a round of the draft model's
    # (the heads and the lookup run no draft model). On a CPU the draft's passes right after the
    # target's run slow and speed up over the next few (the draft's weights read back into cache:
    # 1.3, 0.95, 0.70, 0.55, 0.50 ms on the shipped pair); a round's s draft steps cost
    # t_first_draft + s * t_draft, the line through those passes' running sums
    # (measure/cost_model.chain_line; docs/batch-sizes.md#in-decode-prices). 0: every step
    # at t_draft, as cost models were before it.
    t_first_draft: float = 0.0
    # What a drafting round adds per token it drafted, past t_round and its passes: llama-server
    # samples every drafted and every verified position on the host, and its verify outputs the
    # logits of all k + 1 (llama-bench's pass, the last only). On the long pair a run's fixed γ 3
    # and 6 rounds cost 2.1 ms + 0.19 ms per drafted token past their passes, and one t_round of
    # 3.8 ms fitted on γ 5 and 7 priced every shorter draft too dear: each p-min policy read 4-16 %
    # low (docs/depth.md#llamacpp-at-depth). 0: flat in the draft, as
    # cost models were before it (and ours: what our rounds add per draft step is in t_draft).
    t_round_token: float = 0.0

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if self.by_depth:  # JSON keys are strings; a model without the axis is written as before it
            data["by_depth"] = {str(d): entry for d, entry in sorted(self.by_depth.items())}
        else:
            del data["by_depth"]
        if not self.t_round_token:  # and one flat in the draft as before the term
            del data["t_round_token"]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        return cls(float(data["t_draft"]), [float(t) for t in data["t_verify"]], int(data["context_tokens"]),
                   int(data.get("batch_size", 1)), float(data.get("t_prefill_target", 0.0)),
                   float(data.get("t_prefill_draft", 0.0)), float(data.get("t_heads", 0.0)),
                   float(data.get("spread", 0.0)), float(data.get("t_learned", 0.0)), float(data.get("t_round", 0.0)),
                   float(data.get("t_plain", 0.0)),
                   None if data.get("t_round_empty") is None else float(data["t_round_empty"]),
                   {int(d): _depth_entry(e) for d, e in data.get("by_depth", {}).items()},
                   float(data.get("t_first_draft", 0.0)), float(data.get("t_round_token", 0.0)))

    def at_depths(self, depths, drafter: str = "model") -> tuple[np.ndarray, np.ndarray]:
        """(t_draft [n], round costs [n, k]: `drafter`'s `round_costs` at each depth in `depths`): linear in depth
        between the two nearest timed depths, flat below the shallowest, and extrapolated along the
        deepest two beyond the deepest (a KV-cache read grows linearly with its length). Without a
        depth axis, every depth costs what context_tokens did."""
        depths = np.asarray(depths, dtype=np.float64)
        costs = self.round_costs(drafter)
        extra = np.asarray(costs) - np.asarray(self.t_verify)  # t_round(_token), t_first_draft: flat in depth
        if not self.by_depth:
            return np.full(depths.shape, self.t_draft), np.broadcast_to(costs, (*depths.shape, len(extra)))
        timed = sorted(self.by_depth.items())
        at = np.array([d for d, _ in timed], dtype=np.float64)
        draft = np.array([e["t_draft"] for _, e in timed])
        verify = np.array([e["t_verify"][: len(extra)] for _, e in timed])
        if len(at) == 1:
            return np.full(depths.shape, draft[0]), np.broadcast_to(verify[0] + extra, (*depths.shape, len(extra)))
        lo, hi, w = between_depths(at, depths)
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
        lo, hi, w = between_depths(at, n)
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

    def round_costs(self, drafter: str = "model") -> list[float]:
        """Index k: one round's cost past its draft steps' t_draft each, a draft of k tokens: t_verify(k),
        what the engine adds per round (t_round and k * t_round_token; t_round_empty where k = 0) and,
        where the draft model drafts, its first step's excess (t_first_draft: a round that drafts
        nothing ran it too, the step whose confidence stopped it)."""
        empty = self.t_round if self.t_round_empty is None else self.t_round_empty
        first = self.t_first_draft if drafter == "model" else 0.0
        return [t + (self.t_round + k * self.t_round_token if k else empty) + first
                for k, t in enumerate(self.t_verify)]

    def predict(self, rounds: list[Round], tokens: int) -> float:
        """docs/sweeps-and-replay.md: N * t_plain / sum over rounds of (s_r * t_draft + t_verify(L_r) + t_round
        + L_r * t_round_token + t_first_draft), t_round_empty in place of t_round where L_r = 0."""
        costs = self.round_costs()
        # a draft model's rounds; one that ran no draft step does not pay its first's excess
        spent = sum(r.draft_forwards * self.t_draft + costs[r.drafted]
                    - (0.0 if r.draft_forwards else self.t_first_draft) for r in rounds)
        return self.speedup(tokens, spent)

    def speedup(self, tokens, predicted_time):
        """The predicted speedup of `tokens` generated in `predicted_time` cost-model seconds
        (numbers or arrays): plain decoding's seconds per token (`plain_step`) over the policy's
        own, predicted_time / tokens; the same per-token ratio as a measured speedup."""
        return tokens * self.plain_step / predicted_time


# What a depth's entry may time past its passes: the prefills per prompt token (batch 1) and what the
# learned signal adds to a draft step there (its lookup reads the whole context).
DEPTH_EXTRAS = ("t_prefill_target", "t_prefill_draft", "t_learned")


def _depth_entry(entry: dict) -> dict:
    """One by_depth entry read back: its passes and whichever DEPTH_EXTRAS it holds."""
    return {"t_draft": float(entry["t_draft"]), "t_verify": [float(t) for t in entry["t_verify"]],
            **{k: float(entry[k]) for k in DEPTH_EXTRAS if k in entry}}


def between_depths(at: np.ndarray, depths: np.ndarray):
    """(lower index, upper index, weight) of each depth between timed depths `at` (sorted, ≥ 2):
    flat below the first, extrapolated along the last two beyond the last."""
    hi = np.clip(np.searchsorted(at, depths), 1, len(at) - 1)
    lo = hi - 1
    return lo, hi, np.maximum((depths - at[lo]) / (at[hi] - at[lo]), 0.0)


def relative_iqr(values) -> float:
    """Interquartile range over median: how far repeats of one timing disagree."""
    q1, median, q3 = np.percentile(np.asarray(values, float), [25, 50, 75])
    return float((q3 - q1) / median) if median > 0 else float("inf")


def worst_spread(repeats) -> float:
    """The largest relative IQR over groups of repeated timings."""
    return max((relative_iqr(values) for values in repeats), default=0.0)


@dataclass(frozen=True)
class StepTerms:
    """What a live batch's step and admission cost past their passes, fitted on a running server's
    own steps (harness/in_decode.py; docs/batch-sizes.md#in-decode-prices): a step of r live rows
    costs its passes plus `rows[r]` (speculative servers) or `plain_rows[r]` (plain decoding: less
    host work per row) — the per-row host work and the batch's upkeep at that width, a table over
    the row count (fitted on a line: harness/in_decode.line_over_rows) — and each request joining
    the batch its prompt's prefill plus `join`. A speculative step's draft passes each cost `draft`
    more than the surface's draft pass (below 0: a pass timed alone follows a target pass and reads
    the draft's weights back; in a step all but the first follow a draft pass). A join costs
    `join_slots` more per position of the batch's caches its own is spliced into (replay/slots.spliced:
    the rows already there × the widest one's context): on the long pair at B = 8 a request joining
    7 rows of 3,000 tokens copied 0.7 GB and took 0.3-0.4 s past its prefill, one joining an empty
    batch nothing. A term is below 0 where a live step took less than its isolated passes."""

    rows: list[float]  # index r: seconds past its passes of a speculative step with r live rows
    plain_rows: list[float]
    join: float
    fitted_on: dict = field(default_factory=dict, compare=False)  # the calibration run it came from
    draft: float = 0.0  # seconds past the surface's of each draft pass of a speculative step
    join_slots: float = 0.0  # seconds per position of the batch's caches a joining row is spliced into

    def step(self, rows: np.ndarray, plain: bool = False) -> np.ndarray:
        """Seconds a step of `rows` live rows adds past its passes (the widest fitted beyond it)."""
        table = np.asarray(self.plain_rows if plain else self.rows, dtype=np.float64)
        return table[np.minimum(np.asarray(rows, dtype=np.int64), len(table) - 1)]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "StepTerms":
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


@dataclass
class CostSurface:
    """A cost model over B: one CostModel per measured batch size; `tables` fills every B in between,
    with what a live batch adds past its passes where it was measured (`terms`, else None: the
    passes alone, as timed in isolation)."""

    models: dict[int, CostModel]
    terms: StepTerms | None = None

    def to_dict(self) -> dict:
        out = {"batch_sizes": {str(b): m.to_dict() for b, m in sorted(self.models.items())}}
        return out if self.terms is None else {**out, "in_decode": self.terms.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> "CostSurface":
        terms = StepTerms.from_dict(data["in_decode"]) if data.get("in_decode") else None
        return cls({int(b): CostModel.from_dict(m) for b, m in data["batch_sizes"].items()}, terms)

    def at(self, batch_size: int) -> CostModel:
        return self.models[batch_size]

    def batch_one(self, cost: CostModel) -> CostModel | None:
        """What prices a batch-1 policy (and a batch-1 bound) beside this surface's walks: with `terms`
        (prices timed inside decodes) `cost`, the batch-1 decoder's own model, which pays its own host
        work, not a one-row live batch's step terms (replay/batched.batch_one_priced); timed alone,
        None: the surface at B = 1, as the batched walk prices it — unless `cost` prices a round's first
        draft step apart (t_first_draft), which the walk's steps cannot: then `cost`, as a batch-1 sweep."""
        return cost if self.terms is not None or cost.t_first_draft else None

    def tables(self, batch_size: int, learned: bool = False,
               plain: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(t_draft[b], t_verify[b, k]) for b = 0 .. batch_size rows (a draining batch has fewer),
        linear in b between the measured batch sizes, non-decreasing in b and k; row 0 is unused.
        `learned`: a draft step scored by the learned signal (t_draft + t_learned). With `terms`, each
        row's step terms are in its verify passes (one a step), each draft pass's in the draft pass:
        `plain`, plain decoding's. A draft step here is a round's first (t_first_draft in it:
        measure/cost_model.chain_line's line meets the first step's timing): a step of the batched walk
        prices passes, and B > 1 times its draft pass right after the target's."""
        draft, verify = cost_tables({b: (m.t_draft + m.t_first_draft + (m.t_learned if learned else 0.0), m.t_verify)
                                     for b, m in self.models.items()}, batch_size)
        if self.terms is not None:
            verify = np.maximum(verify + self.terms.step(np.arange(batch_size + 1), plain)[:, None], 0.0)
            draft = np.maximum(draft + self.terms.draft, 0.0)
        return draft, verify

    def join(self) -> float:
        """Seconds a request's admission adds past its prefill (0 without terms; below 0 where
        admissions took less than the isolated prefill: a prefill plus it is kept ≥ 0)."""
        return 0.0 if self.terms is None else self.terms.join

    def join_slots(self) -> float:
        """Seconds per position of the batch's caches a request's admission copies (StepTerms.join_slots)."""
        return 0.0 if self.terms is None else self.terms.join_slots
