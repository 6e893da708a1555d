"""Choosing policies per domain from simulated or measured tables (pure: no models, no clocks).

Each domain's table scores every policy of the search space; the global table sums each
policy's totals over the domains and takes the ratios last, so the global policy maximises the
objective over the union of the domains' prompts. calibrate.py runs the whole job around this.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from dspark_bench.config import POLICY_FIELDS, DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import rates, summarize
from dspark_bench.objectives import OBJECTIVES, rank
from dspark_bench.replay import sampled
from dspark_bench.replay.batched import simulate_with_surface
from dspark_bench.replay.cost import CostSurface
from dspark_bench.replay.simulate import simulate_grid

# Totals that add up over domains; every objective is a function of them.
TOTALS = ("rounds", "drafted_total", "accepted_total", "emitted_total", "full_blocks", "draft_forwards",
          "new_tokens", "predicted_time", "predicted_baseline_time")


def score(totals: pd.DataFrame, cost=None) -> pd.DataFrame:
    """Every objective from summed totals (one row per policy): the ratios are taken last."""
    table = totals.assign(**rates(totals))  # over a column of policies at once
    table["draft_forwards_per_token"] = table["draft_forwards"] / table["new_tokens"]
    if "predicted_baseline_time" in table:  # replay at batch size B: both sides' predicted seconds
        table["predicted_speedup"] = table["predicted_baseline_time"] / table["predicted_time"]
        table["spec_tokens_per_s"] = table["new_tokens"] / table["predicted_time"]
    elif cost is not None:  # a replay's CostModel: predicted_time is in its seconds
        table["predicted_speedup"] = cost.speedup(table["new_tokens"], table["predicted_time"])
        table["spec_tokens_per_s"] = table["new_tokens"] / table["predicted_time"]
    return table


@dataclass
class Choice:
    """What the search chose: per-domain tables (every policy scored) and the global table."""

    configs: list[DecodeConfig]
    objective: str
    column: str  # the table column ranked by
    tables: dict[str, pd.DataFrame]  # domain -> one row per config_id
    global_table: pd.DataFrame

    def best_id(self, domain: str | None = None) -> int:
        table = self.global_table if domain is None else self.tables[domain]
        return int(rank(table, self.objective, self.column)["config_id"].iloc[0])

    def best(self, domain: str | None = None) -> DecodeConfig:
        return self.configs[self.best_id(domain)]

    def value(self, config_id: int, domain: str | None = None) -> float:
        table = self.global_table if domain is None else self.tables[domain]
        return float(table.loc[table["config_id"] == config_id, self.column].iloc[0])


def combine(tables: dict[str, pd.DataFrame], cost=None) -> pd.DataFrame:
    """The global table: each policy's totals summed over the domains, then scored."""
    stacked = pd.concat(tables.values(), ignore_index=True)
    totals = stacked.groupby("config_id", sort=True)[[c for c in TOTALS if c in stacked]].sum().reset_index()
    return score(totals, cost)


def choose_from_records(records: dict, configs: list[DecodeConfig], cost, objective: str = "speedup") -> Choice:
    """Replay: simulate every policy on every domain's record and pick per domain and globally.

    `records` maps a domain to its replay `Record`; `cost` is a `CostModel` shared by all
    domains (the same models on the same machine), or a `CostSurface` that predicts each policy
    at its own batch size (each domain's prompts batched together).
    """

    if not records:
        raise DsparkError("calibration needs at least one domain")
    tables = {}
    for domain, rec in records.items():
        rec = sampled.as_one(rec)  # sampled: every replicate's rows, so totals are sums over them
        if isinstance(cost, CostSurface):
            grid = simulate_with_surface(rec, configs, cost)
        else:
            grid = simulate_grid(rec, configs, cost)
        knobs = grid[["config_id", *POLICY_FIELDS]]
        tables[domain] = knobs.merge(score(grid[["config_id", *[c for c in TOTALS if c in grid]]], cost),
                                     on="config_id")
    global_table = configs_frame(configs).merge(combine(tables, cost), on="config_id")
    return Choice(configs, objective, OBJECTIVES[objective].column("replay"), tables, global_table)


def choose_from_samples(samples: dict[str, pd.DataFrame], configs: list[DecodeConfig],
                        objective: str = "speedup") -> Choice:
    """Real runs: rank measured policies per domain; the global table summarises all samples."""
    def table(frame: pd.DataFrame) -> pd.DataFrame:
        summary = summarize(frame)
        return configs_frame(configs).merge(summary.drop(columns=["config_label"]), on="config_id")

    tables = {domain: table(frame) for domain, frame in samples.items()}
    global_table = table(pd.concat(samples.values(), ignore_index=True))
    return Choice(configs, objective, OBJECTIVES[objective].column("real"), tables, global_table)


def configs_frame(configs: list[DecodeConfig]) -> pd.DataFrame:
    return pd.DataFrame([{"config_id": i, "config_label": c.label(), **{f: c.to_dict()[f] for f in POLICY_FIELDS}}
                         for i, c in enumerate(configs)])
