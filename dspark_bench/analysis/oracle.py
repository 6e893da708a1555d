"""The headroom: what any stopping rule could win with perfect knowledge of acceptance.

No schedule can beat a policy that knows, before drafting, how many of the drafted tokens the
target will accept. Replay knows it exactly (the record's match lengths M[p, j]), so the bound
is computed, not estimated:

- at batch size 1, `oracle` is the exact optimum: a dynamic program over positions that picks
  each round's draft length k in 0 .. min(M[p, j], gamma_max, budget) (drafting past the
  accepted run only adds cost) to minimise the cost model's time for the whole continuation;
- at B > 1, `perfect_stopping` drafts exactly the accepted run each round (a policy whose signal
  is 1 where the token is accepted, 0 where not) through the batched walk in both layouts. It
  is not an optimum over batch costs (a padded batch may prefer a shorter draft for every row)
  but the stopping a perfectly calibrated per-row rule would make; a batch rule (the budget
  schedule, decoding/budget.py) trades rows against each other and can pass it.

`headroom` puts them beside the best fixed γ and the best scheduled policy of a replayed table
(and the best of each kind: raw metrics, the learned signal, the budget schedule):
the share of the oracle's gain over fixed γ that the best policy captures says, before any
tuning, whether tuning can pay for a pair.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dspark_bench import objectives, schedules
from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.replay.acceptance import accepted_steps
from dspark_bench.replay.batched import simulate_with_surface
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.record import Record
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.replay.simulate import simulate_grid, unused_first


def round_cost(cost: CostModel, k: int, drafter: str = "model") -> float:
    """One round drafting exactly k tokens: k draft forwards (heads: one pass; lookup: none) and a
    verify of k tokens."""
    drafting = k * cost.t_draft if drafter == "model" else (cost.t_heads if drafter == "heads" and k else 0.0)
    # A round drafting nothing runs no draft step (its first's excess unpaid).
    return drafting + cost.round_costs(drafter)[k] - (unused_first(cost, drafter) if k == 0 else 0.0)


def oracle_lengths(rec: Record, cost: CostModel, gamma_max: int,
                   drafter: str = "model") -> tuple[list[list[int]], float]:
    """Per prompt the optimal draft length of each round, and the total cost-model seconds."""
    matches = match_lengths(rec)
    rounds, total = [], 0.0
    for p, length in enumerate(rec.lengths.astype(int)):
        best = np.zeros(length + 1)  # best[j]: the least time to emit tokens j .. length - 1
        choice = np.zeros(length, dtype=int)
        for j in range(length - 1, -1, -1):
            cap = min(gamma_max, int(matches[p, j]), rec.max_new_tokens - j - 1, int(rec.available[p, j]))
            options = [round_cost(cost, k, drafter) + best[min(j + k + 1, length)] for k in range(max(cap, 0) + 1)]
            choice[j] = int(np.argmin(options))
            best[j] = options[choice[j]]
        j, chosen = 0, []
        while j < length:
            chosen.append(int(choice[j]))
            j += choice[j] + 1
        rounds.append(chosen)
        total += best[0]
    return rounds, total


def oracle(rec: Record, cost: CostModel, gamma_max: int, drafter: str = "model",
           surface: CostSurface | None = None) -> dict:
    """The batch-1 optimum's totals and predicted speedup: priced by `cost` as simulate_grid prices
    (no prefill), or, with `surface`, as the batched walk prices batch size 1 (its tables, and each
    request's prefill on both sides), so that it sits beside that walk's predictions."""
    tokens = int(rec.lengths.sum())
    if surface is not None:
        draft, verify = surface.tables(1)
        cost = CostModel(float(draft[1]), [float(v) for v in verify[1]], cost.context_tokens, 1,
                         t_heads=cost.t_heads)
    rounds, seconds = oracle_lengths(rec, cost, gamma_max, drafter)
    speedup = float(cost.speedup(tokens, seconds))
    if surface is not None:
        alone = surface.at(min(surface.models))
        prompt = np.maximum(np.asarray(rec.info.get("prompt_tokens", [1] * len(rec.lengths)), dtype=float) - 1, 0)
        baseline = tokens * cost.t_verify[0] + prompt.sum() * alone.t_prefill_target
        speedup = float(baseline / (seconds + prompt.sum() * (alone.t_prefill_target + alone.t_prefill_draft)))
    drafted = sum(sum(r) for r in rounds)
    count = sum(len(r) for r in rounds)
    return {"predicted_speedup": speedup, "rounds": count, "drafted_total": drafted,
            "tokens_per_round": tokens / count, "avg_draft_len": drafted / count, "gamma_max": gamma_max}


def perfect_record(rec: Record) -> Record:
    """The record with its top1 replaced by perfect knowledge: 1 where the drafted token is accepted."""
    knows = accepted_steps(match_lengths(rec), rec.gamma_record).astype(np.float32)
    return Record(rec.continuation, rec.lengths, rec.rollout, {**rec.confidences, "top1": knows}, rec.eos_ids,
                  rec.info, rec.available)


def perfect_policies(gammas, batch_sizes, max_new_tokens: int, drafter: str = "model") -> list[DecodeConfig]:
    """Perfect stopping at each gamma_max and batch size (threshold 0.5 on the 0/1 signal)."""
    return [DecodeConfig.of(metric="top1", schedule=schedules.THRESHOLD, threshold=0.5, min_draft_len=0, gamma_max=g,
                         batch_size=b, max_new_tokens=max_new_tokens, drafter=drafter)
            for b in batch_sizes for g in gammas]


def perfect_stopping(rec: Record, gammas, batch_sizes, cost: CostModel | None = None,
                     surface: CostSurface | None = None, drafter: str = "model") -> pd.DataFrame:
    """Perfect stopping's predicted speedups, one row per (B, gamma_max): padded and packed at B > 1."""
    perfect = perfect_record(rec)
    policies = perfect_policies(gammas, batch_sizes, rec.max_new_tokens, drafter)
    if surface is not None and max(batch_sizes) > 1:  # B = 1 priced as the sweep's table prices it
        return simulate_with_surface(perfect, policies, surface, batch_one=surface.batch_one(cost))
    return simulate_grid(perfect, policies, cost)


def walked_at_one(surface: CostSurface | None, cost: CostModel, batch_sizes) -> CostSurface | None:
    """The surface the batch-1 oracle is priced on beside a sweep's table (`oracle`'s `surface`): the
    batched walk's where the sweep spans B > 1 on passes timed alone; None, the batch-1 cost model,
    at B = 1 alone or on prices timed inside decodes, where the sweep prices its batch-1 policies on
    the batch-1 decoder's own model (CostSurface.batch_one)."""
    return surface if surface is not None and max(batch_sizes) > 1 and surface.batch_one(cost) is None else None


def headroom(table: pd.DataFrame, rec: Record, cost: CostModel, surface: CostSurface | None = None) -> list[dict]:
    """Per batch size (and layout at B > 1): autoregressive, the best fixed γ, the best scheduled
    policy, the oracle, and the share of the oracle's gain over fixed γ the best policy captures
    (all predicted by replay on one record and cost table)."""
    rows = []
    gammas = list(range(1, min(int(table["gamma_max"].max()), rec.gamma_record) + 1))
    batch_sizes = sorted({int(b) for b in table["batch_size"]}) if "batch_size" in table else [1]
    drafter = "model"
    if "drafter" in table:
        table = table[table["drafter"] == drafter]
    perfect = perfect_stopping(rec, gammas, batch_sizes, cost, surface, drafter)
    exact = (oracle(rec, cost, max(gammas), drafter, walked_at_one(surface, cost, batch_sizes))
             if 1 in batch_sizes else None)
    for batch_size in batch_sizes:
        group = table[table["batch_size"] == batch_size] if "batch_size" in table else table
        stops = perfect[perfect["batch_size"] == batch_size] if "batch_size" in perfect else perfect
        layouts = [("padded", "predicted_speedup")] + ([("packed", "predicted_speedup_packed")]
                                                        if batch_size > 1 and "predicted_speedup_packed" in group
                                                        else [])
        for layout, column in layouts:
            baseline = schedules.where(group, baseline=True)
            fixed = objectives.rank(group[baseline], "speedup", column)
            scheduled = objectives.rank(group[~baseline], "speedup", column)
            if fixed.empty or scheduled.empty:
                continue
            bound = stops.sort_values(column, ascending=False).iloc[0]
            oracle_speedup = exact["predicted_speedup"] if batch_size == 1 else float(bound[column])
            row = headroom_row(batch_size, layout if batch_size > 1 else "—", fixed.iloc[0], scheduled.iloc[0], column,
                               oracle_speedup, "exact optimum" if batch_size == 1 else
                               f"perfect stopping γ≤{int(bound['gamma_max'])}")
            rows.append({**row, **best_of_kinds(group, column)})
    return rows


# The scheduled policies by kind, as the headroom table shows them: the per-row rules on a raw
# metric, the same rules on the learned signal, and the batch's budget (on either signal).
KINDS = {"raw": lambda t: (~schedules.where(t, baseline=True) & ~schedules.where(t, whole_batch=True)
                           & (t["metric"] != LEARNED)),
         "learned": lambda t: ~schedules.where(t, whole_batch=True) & (t["metric"] == LEARNED),
         "budget": lambda t: schedules.where(t, whole_batch=True)}


def best_of_kinds(group: pd.DataFrame, column: str) -> dict:
    """best_<kind> (its label, None where the table has none) and best_<kind>_speedup per KINDS."""
    out = {}
    for kind, members in KINDS.items():
        best = objectives.rank(group[members(group)], "speedup", column)
        out[f"best_{kind}"] = None if best.empty else best.iloc[0]["config_label"]
        out[f"best_{kind}_speedup"] = None if best.empty else float(best.iloc[0][column])
    return out


def captured_cell(captured) -> str:
    """A share of the oracle's gain as the tables show it: "—" where there is none to take; past
    100 %, a batch rule beat per-row perfect stopping."""
    if captured is None or captured != captured:
        return "—"
    return f"{captured:.0%}" if captured <= 1 else "past the per-row bound"


def headroom_row(batch_size, layout, fixed, scheduled, column, oracle_speedup, oracle_kind) -> dict:
    fixed_speedup, best_speedup = float(fixed[column]), float(scheduled[column])
    gain = oracle_speedup - fixed_speedup
    return {"batch_size": int(batch_size), "layout": layout, "autoregressive": 1.0,
            "best_fixed": fixed["config_label"], "best_fixed_speedup": fixed_speedup,
            "best_scheduled": scheduled["config_label"], "best_scheduled_speedup": best_speedup,
            "oracle": oracle_kind, "oracle_speedup": float(oracle_speedup),
            "captured": float((best_speedup - fixed_speedup) / gain) if gain > 0 else float("nan")}
