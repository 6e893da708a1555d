"""Per-domain calibration: the best policy for each kind of traffic, in a file the decoder loads.

The draft is surer of itself on some text than on other text (code vs prose), so the threshold
that is best for one domain is wrong for another. For every domain (a task, or a category of a
user's dataset) calibration finds the best policy of a sweep's search space, finds the best
single *global* policy over all domains together, and measures both on each domain's prompts:

    choose      replay (greedy): record each domain once, simulate every policy, rank;
                real runs otherwise; the global policy maximises the objective over the
                union of the domains' prompts (per-domain totals summed, then ratios taken)
    confirm     a timed `runner.run` of each domain's policy and of the global policy
    write       calibration YAML (atomic, never overwritten without `force`) + a PNG figure

`load_calibration(path)` reads the file back for the decoder: `policy_for(domain)` and
`configs_for(prompts)`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from dspark_bench.config import DecodeConfig, from_dict
from dspark_bench.errors import DsparkError
from dspark_bench.metrics import rates, summarize
from dspark_bench.prompts import Prompt
from dspark_bench.results import environment
from dspark_bench.runner import StageProgress, stage_steps
from dspark_bench.sweep import OBJECTIVES, SweepSpec, base_config, engine_for, points

SCHEMA_VERSION = 1
TOP_LEVEL_KEYS = ("schema_version", "created", "environment", "models", "objective", "engine", "max_new_tokens", "cost_model",
                  "global", "domains", "figure")
POLICY_FIELDS = ("metric", "schedule", "threshold", "threshold_start", "threshold_end", "gamma_max",
                 "min_draft_len", "topk")
QUANTILES = (10, 25, 50, 75, 90)
# Totals that add up over domains; every objective is a function of them.
TOTALS = ("rounds", "drafted_total", "accepted_total", "emitted_total", "full_blocks", "draft_forwards",
          "new_tokens", "predicted_time")



# --- choosing policies from records (pure: no models, no clocks) ---------------------------------


def objective_column(objective: str, engine: str) -> str:
    """The table column an objective ranks by: replay predicts speedup, real runs measure it."""
    return "predicted_speedup" if objective == "speedup" and engine == "replay" else objective


def score(totals: pd.DataFrame, t_verify0: float | None) -> pd.DataFrame:
    """Every objective from summed totals (one row per policy): the ratios are taken last."""
    table = totals.assign(**rates(totals))  # over a column of policies at once
    table["draft_forwards_per_token"] = table["draft_forwards"] / table["new_tokens"]
    if t_verify0 is not None:
        # predicted_time is in cost-model seconds: N * t_verify(0) of plain decoding over it.
        table["predicted_speedup"] = table["new_tokens"] * t_verify0 / table["predicted_time"]
        table["spec_tokens_per_s"] = table["new_tokens"] / table["predicted_time"]
    return table


def rank(table: pd.DataFrame, column: str, objective: str) -> pd.DataFrame:
    """Best first; ties keep the search space's order (stable sort on config_id)."""
    ascending = OBJECTIVES[objective] == "minimize"
    return table.sort_values([column, "config_id"], ascending=[ascending, True], kind="mergesort")


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
        return int(rank(table, self.column, self.objective)["config_id"].iloc[0])

    def best(self, domain: str | None = None) -> DecodeConfig:
        return self.configs[self.best_id(domain)]

    def value(self, config_id: int, domain: str | None = None) -> float:
        table = self.global_table if domain is None else self.tables[domain]
        return float(table.loc[table["config_id"] == config_id, self.column].iloc[0])


def combine(tables: dict[str, pd.DataFrame], t_verify0: float | None) -> pd.DataFrame:
    """The global table: each policy's totals summed over the domains, then scored."""
    stacked = pd.concat(tables.values(), ignore_index=True)
    totals = stacked.groupby("config_id", sort=True)[[c for c in TOTALS if c in stacked]].sum().reset_index()
    return score(totals, t_verify0)


def choose_from_records(records: dict, configs: list[DecodeConfig], cost, objective: str = "speedup") -> Choice:
    """Replay: simulate every policy on every domain's record and pick per domain and globally.

    `records` maps a domain to its replay `Record`; `cost` is a `CostModel` shared by all
    domains (the same models on the same machine).
    """
    from dspark_bench.replay import simulate_grid

    if not records:
        raise DsparkError("calibration needs at least one domain")
    t0 = cost.t_verify[0]
    tables = {}
    for domain, rec in records.items():
        grid = simulate_grid(rec, configs, cost)
        knobs = grid[["config_id", *POLICY_FIELDS]]
        tables[domain] = knobs.merge(score(grid[["config_id", *TOTALS]], t0), on="config_id")
    global_table = configs_frame(configs).merge(combine(tables, t0), on="config_id")
    return Choice(configs, objective, objective_column(objective, "replay"), tables, global_table)


def choose_from_samples(samples: dict[str, pd.DataFrame], configs: list[DecodeConfig],
                        objective: str = "speedup") -> Choice:
    """Real runs: rank measured policies per domain; the global table summarises all samples."""
    def table(frame: pd.DataFrame) -> pd.DataFrame:
        summary = summarize(frame)
        return configs_frame(configs).merge(summary.drop(columns=["config_label"]), on="config_id")

    tables = {domain: table(frame) for domain, frame in samples.items()}
    global_table = table(pd.concat(samples.values(), ignore_index=True))
    return Choice(configs, objective, objective_column(objective, "real"), tables, global_table)


def configs_frame(configs: list[DecodeConfig]) -> pd.DataFrame:
    return pd.DataFrame([{"config_id": i, "config_label": c.label(), **{f: getattr(c, f) for f in POLICY_FIELDS}}
                         for i, c in enumerate(configs)])


def confidence_quantiles(rec, metric: str = "top1") -> dict[str, float]:
    """Quantiles of the draft's confidence over every proposal the record holds for a domain
    (rollout steps 1..gamma_record from every position of the target's continuation)."""
    inside = np.arange(rec.rollout.shape[1])[None, :] < rec.lengths[:, None]  # [P, N]
    values = rec.confidences[metric][inside].ravel()
    if values.size == 0:
        return {f"p{q}": float("nan") for q in QUANTILES}
    return {f"p{q}": round(float(v), 4) for q, v in zip(QUANTILES, np.percentile(values, QUANTILES))}


# --- the figure ---------------------------------------------------------------------------------


def threshold_curves(choice: Choice) -> pd.DataFrame:
    """Per domain: the objective vs threshold along the domain's best (metric, schedule, gamma_max,
    min_draft_len) — one line per domain; `best` marks the domain's chosen point."""
    frames = []
    for domain, table in choice.tables.items():
        candidates = rank(table[table["schedule"].isin(["threshold", "cumulative"])], choice.column, choice.objective)
        if candidates.empty:
            continue  # a space of only ramp / fixed schedules has no threshold axis
        lead = candidates.iloc[0]
        keys = ["metric", "schedule", "gamma_max", "min_draft_len", "topk"]
        line = table[(table[keys] == lead[keys]).all(axis=1)].sort_values("threshold")
        frames.append(pd.DataFrame({
            "domain": domain, "threshold": line["threshold"].to_numpy(), "value": line[choice.column].to_numpy(),
            "best": (line["config_id"] == lead["config_id"]).to_numpy(),
            "curve": f"{lead['metric']} {lead['schedule']} γ≤{lead['gamma_max']} min{lead['min_draft_len']}",
        }))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["domain", "threshold", "value", "best", "curve"])


def threshold_figure(curves: pd.DataFrame, ylabel: str, global_threshold: float | None = None):
    """The domains' threshold curves on one axis, each domain's best marked; returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (domain, line) in enumerate(curves.groupby("domain", sort=False)):
        color = colors[i % len(colors)]
        axis.plot(line["threshold"], line["value"], marker="o", markersize=3, color=color,
                  label=f"{domain} ({line['curve'].iloc[0]})")
        best = line[line["best"]]
        axis.scatter(best["threshold"], best["value"], s=140, marker="*", color=color, edgecolor="black",
                     zorder=5)
        for _, row in best.iterrows():
            axis.annotate(f"{row['threshold']:g}", (row["threshold"], row["value"]), textcoords="offset points",
                          xytext=(0, 9), ha="center", fontsize=9, color=color,
                          bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    if global_threshold is not None:
        axis.axvline(global_threshold, color="grey", linestyle="--", linewidth=1,
                     label=f"global policy threshold {global_threshold:g}")
    if "speedup" in ylabel:
        axis.axhline(1.0, color="black", linewidth=0.8, alpha=0.6)  # break-even with plain decoding
    axis.margins(y=0.12)  # room for the labels above the stars
    axis.set_xlabel("threshold (confidence below which drafting stops)")
    axis.set_ylabel(ylabel)
    axis.set_title("Calibration: objective vs threshold per domain (★ = domain's best)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="best")
    figure.tight_layout()
    return figure


# --- the calibration file -----------------------------------------------------------------------


@dataclass(frozen=True)
class DomainCalibration:
    policy: DecodeConfig
    measured: dict = field(default_factory=dict)  # everything else the file says about the domain


@dataclass(frozen=True)
class Calibration:
    """A loaded calibration file: a policy per domain and a global policy for the rest."""

    global_policy: DecodeConfig
    domains: dict[str, DomainCalibration]
    models: dict
    objective: str
    path: Path | None = None
    data: dict = field(default_factory=dict, repr=False)  # the file as read

    def policy_for(self, domain: str, strict: bool = False, base: DecodeConfig | None = None) -> DecodeConfig:
        """The domain's policy; an unknown domain gets the global policy (or an error if strict).

        With `base`, only the policy knobs (POLICY_FIELDS) are taken from the calibration and
        the rest (max_new_tokens, temperature, top_p, seed) stay the base's.
        """
        if domain in self.domains:
            policy = self.domains[domain].policy
        elif strict:
            raise DsparkError(f"calibration {self._where()} has no domain {domain!r}; "
                              f"it has: {', '.join(self.domains) or 'none'}")
        else:
            policy = self.global_policy
        if base is None:
            return policy
        return base.replace(**{name: getattr(policy, name) for name in POLICY_FIELDS})

    def configs_for(self, prompts: list[Prompt], strict: bool = False,
                    base: DecodeConfig | None = None) -> list[DecodeConfig]:
        """One config per prompt, keyed on the prompt's category (its domain)."""
        return [self.policy_for(p.category, strict, base) for p in prompts]

    def groups(self, prompts: list[Prompt], strict: bool = False,
               base: DecodeConfig | None = None) -> list[tuple[DecodeConfig, list[Prompt]]]:
        """Prompts grouped by the config they get, in first-seen order (one runner call each)."""
        grouped: dict[DecodeConfig, list[Prompt]] = {}
        for prompt, config in zip(prompts, self.configs_for(prompts, strict, base)):
            grouped.setdefault(config, []).append(prompt)
        return list(grouped.items())

    def check_models(self, models: dict) -> None:
        """Refuse a pair other than the one the calibration was made with (by fingerprint)."""
        for key in ("target_fingerprint", "draft_fingerprint"):
            if self.models.get(key) and models.get(key) and self.models[key] != models[key]:
                raise DsparkError(f"calibration {self._where()} was made with another {key.split('_')[0]} model "
                                  f"({self.models[key]} vs {models[key]}); calibrate again")

    def _where(self) -> str:
        return repr(str(self.path)) if self.path else "(in memory)"


def _policy(data: object, where: str) -> DecodeConfig:
    if not isinstance(data, dict):
        raise DsparkError(f"{where}: policy must be a mapping of DecodeConfig fields")
    try:
        return from_dict(data)
    except DsparkError as err:
        raise DsparkError(f"{where}: invalid policy: {err}") from None
    except TypeError as err:  # a value of the wrong type, e.g. a list for a threshold
        raise DsparkError(f"{where}: invalid policy: {err}") from None


def parse_calibration(data: object, where: str = "calibration") -> Calibration:
    if not isinstance(data, dict):
        raise DsparkError(f"{where}: a calibration file must be a mapping")
    unknown = sorted(set(map(str, data)) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise DsparkError(f"{where}: unknown top-level key(s) {', '.join(unknown)}; known: {', '.join(TOP_LEVEL_KEYS)}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise DsparkError(f"{where}: schema_version {data.get('schema_version')!r} is not supported "
                          f"(this version reads {SCHEMA_VERSION}); calibrate again")
    missing = [key for key in ("models", "global", "domains") if key not in data]
    if missing:
        raise DsparkError(f"{where}: missing key(s) {', '.join(missing)}")
    entry = data["global"]
    if not isinstance(entry, dict) or "policy" not in entry:
        raise DsparkError(f"{where}: global must be a mapping with a policy")
    global_policy = _policy(entry["policy"], f"{where}: global")
    if not isinstance(data["domains"], dict):
        raise DsparkError(f"{where}: domains must be a mapping of domain -> entry")
    domains = {}
    for name, entry in data["domains"].items():
        if not isinstance(entry, dict) or "policy" not in entry:
            raise DsparkError(f"{where}: domain {name!r} must be a mapping with a policy")
        if not isinstance(entry["policy"], dict):
            raise DsparkError(f"{where}: domain {name!r}: policy must be a mapping of DecodeConfig fields")
        # A domain's entry names the policy's knobs; verification settings come from the global policy.
        policy = _policy({**global_policy.to_dict(), **entry["policy"]}, f"{where}: domain {name!r}")
        domains[str(name)] = DomainCalibration(policy,
                                       {k: v for k, v in entry.items() if k != "policy"})
    models = data["models"] if isinstance(data["models"], dict) else {}
    return Calibration(global_policy, domains, models, str(data.get("objective", "speedup")), data=data)


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration file; any problem is one DsparkError line."""
    path = Path(path)
    if not path.is_file():
        raise DsparkError(f"calibration file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise DsparkError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DsparkError(f"{path}: cannot read ({err})") from None
    return dataclasses.replace(parse_calibration(data, str(path)), path=path)


def check_output(out: Path, force: bool) -> tuple[Path, Path]:
    """The calibration file and its figure; refuse to overwrite either unless `force`."""
    out = Path(out)
    figure = out.with_suffix(".png")
    if not force:
        for path in (out, figure):
            if path.exists():
                raise DsparkError(f"{str(path)!r} already exists; pass --force to overwrite it")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DsparkError(f"cannot create {str(out.parent)!r}: {err.strerror or err}") from None
    if not os.access(out.parent, os.W_OK):
        raise DsparkError(f"output folder {str(out.parent)!r} is not writable")
    return out, figure


def write_calibration(data: dict, figure, out: Path, force: bool = False) -> Path:
    """Write the YAML (and the figure beside it) under temporary names, then rename into place."""
    out, figure_path = check_output(out, force)
    parse_calibration(data, str(out))  # never write a file the loader would refuse
    partial = out.with_name(f".{out.name}.partial")
    partial_png = figure_path.with_name(f".{figure_path.stem}.partial.png")
    try:
        partial.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
        if figure is not None:
            figure.savefig(partial_png)
            os.replace(partial_png, figure_path)
        os.replace(partial, out)
    finally:
        for path in (partial, partial_png):
            path.unlink(missing_ok=True)
    return out


# --- the whole job: prompts, records, choice, confirmation, file ---------------------------------


def domain_prompts(spec: SweepSpec, tasks: list[str] | None = None) -> dict[str, list[Prompt]]:
    """Domain -> prompts: one domain per task (its `domain`), or one per category of the dataset.

    `spec.limit` is the number of prompts per domain.
    """
    from dspark_bench.tasks import get_task, load_dataset_prompts, load_task

    if tasks:
        specs = [get_task(name) for name in tasks]  # every name checked before any prompt is built
        domains: dict[str, list[Prompt]] = {}
        for task in specs:
            if task.domain in domains:
                raise DsparkError(f"task {task.name!r} and another task share the domain {task.domain!r}")
            prompts = load_task(task.name, spec.limit)
            domains[task.domain] = [dataclasses.replace(p, category=task.domain) for p in prompts]
        return domains
    if spec.dataset is None:
        return domain_prompts(spec, [spec.task])
    prompts = load_dataset_prompts(spec.dataset, spec.split, spec.prompt_field, spec.category_field)
    domains = {}
    for prompt in prompts:
        chosen = domains.setdefault(prompt.category, [])
        if spec.limit is None or len(chosen) < spec.limit:
            chosen.append(prompt)
    return domains


def _max_new_tokens(spec: SweepSpec, tasks: list[str] | None) -> int | None:
    from dspark_bench.tasks import get_task

    if spec.max_new_tokens or not tasks:
        return spec.max_new_tokens
    lengths = {get_task(name).max_new_tokens for name in tasks}
    return lengths.pop() if len(lengths) == 1 else 128


def search_configs(spec: SweepSpec, base: DecodeConfig) -> list[DecodeConfig]:
    configs = points(spec, base)
    return list(dict.fromkeys(configs))  # a repeated value in the space would only tie with itself


@dataclass
class Calibrated:
    """What `calibrate_domains` did: the file, its content and the choice behind it."""

    path: Path
    figure: Path
    data: dict
    choice: Choice


def record_domains(pair, domains: dict[str, list[Prompt]], base: DecodeConfig, gamma: int,
                   progress: StageProgress | None = None) -> tuple[dict, object]:
    """A replay record per domain, and one cost model (timed on the first domain's first prompt)."""
    from dspark_bench.prompts import encode, prompts_fingerprint
    from dspark_bench.replay import measure_cost, record

    models, records, first_context = pair.describe(), {}, None
    for domain, prompts in domains.items():
        ids = [encode(pair.tokenizer, p.text) for p in prompts]
        info = {"models": models, "prompts_fingerprint": prompts_fingerprint(prompts), "domain": domain,
                "prompt_ids": [p.id for p in prompts]}
        records[domain] = rec = record(pair, ids, base.max_new_tokens, gamma, base.topk, info,
                                       progress=stage_steps(progress, f"recording {domain}", len(ids)))
        if first_context is None:
            # Timed with the cache at a realistic length: a prompt plus half its output.
            first_context = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    if progress:
        progress("timing the cost model", 0, 1)
    return records, measure_cost(pair, first_context, gamma)


def measure_domains(pair, domains: dict[str, list[Prompt]], chosen: dict[str, DecodeConfig],
                    global_policy: DecodeConfig, repeats: int, progress: StageProgress | None = None) -> dict[str, pd.DataFrame]:
    """Timed runs of each domain's policy and the global one on that domain's prompts.

    Returns domain -> samples with `role` "domain" / "global" (one run, so a domain whose
    policy is the global one has one measurement for both)."""
    from dspark_bench.runner import RunnerSettings, run

    samples = {}
    for domain, prompts in domains.items():
        configs = list(dict.fromkeys([chosen[domain], global_policy]))
        step = stage_steps(progress, f"timing {domain}", len(prompts) * len(configs))
        output = run(pair, prompts, configs, RunnerSettings(repeats=repeats), progress=step).samples
        frames = [output[output["config_id"] == configs.index(chosen[domain])].assign(role="domain"),
                  output[output["config_id"] == configs.index(global_policy)].assign(role="global")]
        samples[domain] = pd.concat(frames, ignore_index=True)
    return samples


def _measured(samples: pd.DataFrame) -> dict:
    row = summarize(samples.assign(config_id=0)).iloc[0]
    return {"tokens_per_round": round(float(row["tokens_per_round"]), 4),
            "acceptance_rate": round(float(row["acceptance_rate"]), 4),
            "speedup": round(float(row["speedup"]), 4),
            "speedup_low": round(float(row["speedup_low"]), 4), "speedup_high": round(float(row["speedup_high"]), 4),
            "identical_to_baseline": None if pd.isna(row.get("identical_to_baseline")) else
            float(row["identical_to_baseline"])}


def policy_dict(config: DecodeConfig) -> dict:
    return {name: (round(v, 6) if isinstance(v, float) else v) for name, v in config.to_dict().items()}


def calibration_data(choice: Choice, chosen: dict[str, DecodeConfig], global_policy: DecodeConfig,
                     samples: dict[str, pd.DataFrame], records: dict | None, models: dict, engine: str,
                     cost=None, figure_name: str | None = None) -> dict:
    """The file's content: schema, models, the global policy and every domain's entry."""
    global_id = choice.configs.index(global_policy)
    # What the search ranked by, kept apart from the confirmation's measured columns.
    search = choice.column if choice.column.startswith("predicted_") else f"search_{choice.column}"
    everything = pd.concat(samples.values(), ignore_index=True)
    data = {
        "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "environment": environment(),  # versions, git commit and the machine the speedups come from
        "models": {k: models.get(k) for k in ("target", "draft", "target_fingerprint", "draft_fingerprint",
                                              "device", "dtype")},
        "objective": choice.objective,
        "engine": engine,
        "max_new_tokens": global_policy.max_new_tokens,
        "cost_model": cost.to_dict() if cost is not None else None,
        "global": {"policy": policy_dict(global_policy), "label": global_policy.label(),
                   search: round(choice.value(global_id), 4),
                   "measured": _measured(everything[everything["role"] == "global"])},
        "domains": {},
        "figure": figure_name,
    }
    for domain, config in chosen.items():
        config_id = choice.configs.index(config)
        mine, theirs = samples[domain][samples[domain]["role"] == "domain"], samples[domain][samples[domain]["role"] == "global"]
        measured, global_measured = _measured(mine), _measured(theirs)
        entry = {
            "policy": {name: policy_dict(config)[name] for name in POLICY_FIELDS},
            "label": config.label(),
            "prompts": int(mine["prompt_id"].nunique()),
            **measured,
            "global_speedup": global_measured["speedup"],
            "global_speedup_low": global_measured["speedup_low"],
            "global_speedup_high": global_measured["speedup_high"],
            "gain": round(measured["speedup"] / global_measured["speedup"], 4),
            search: round(choice.value(config_id, domain), 4),
            f"global_{search}": round(choice.value(global_id, domain), 4),
            "shift": {"threshold": round(config.threshold, 6), "global_threshold": round(global_policy.threshold, 6)},
        }
        if records is not None:
            entry["shift"]["confidence_top1"] = confidence_quantiles(records[domain])
        data["domains"][domain] = entry
    return data


def calibrate_domains(spec: SweepSpec, out: Path, tasks: list[str] | None = None, force: bool = False,
                      progress: StageProgress | None = None, pair=None,
                      domains: dict[str, list[Prompt]] | None = None) -> Calibrated:
    """Calibrate a policy per domain (each task in `tasks`, else each category of `spec.dataset`)
    over `spec`'s search space, confirm with timed runs, and write the calibration file `out`.

    `domains` (from `domain_prompts`) skips loading the prompts again; `pair` the models."""
    from dspark_bench.models import load_pair

    check_output(out, force)  # fail before any model loads
    engine = engine_for(spec)
    objective = spec.objective[0]
    base = base_config(spec, _max_new_tokens(spec, tasks or ([spec.task] if spec.task and not spec.dataset else None)))
    configs = search_configs(spec, base)
    domains = domains if domains is not None else domain_prompts(spec, tasks)
    empty = [d for d, p in domains.items() if not p]
    if not domains or empty:
        raise DsparkError(f"no prompts for domain(s) {', '.join(empty)}" if empty else "no domains to calibrate")
    pair = pair or load_pair(spec.target, spec.draft, spec.device, spec.dtype)
    records, cost = None, None
    if engine == "replay":
        records, cost = record_domains(pair, domains, base, max(c.gamma_max for c in configs), progress)
        choice = choose_from_records(records, configs, cost, objective)
    else:
        choice = choose_from_samples(search_real(pair, domains, configs, spec.repeats, progress), configs, objective)
    chosen = {domain: choice.best(domain) for domain in domains}
    global_policy = choice.best()
    samples = measure_domains(pair, domains, chosen, global_policy, spec.repeats, progress)
    out, figure_path = check_output(out, force)
    data = calibration_data(choice, chosen, global_policy, samples, records, pair.describe(), engine, cost,
                            figure_path.name)
    ylabel = {"predicted_speedup": "predicted speedup (replay + cost model)"}.get(choice.column, choice.column)
    figure = threshold_figure(threshold_curves(choice), ylabel, global_policy.threshold)
    try:
        write_calibration(data, figure, out, force)
    finally:
        import matplotlib.pyplot as plt

        plt.close(figure)
    return Calibrated(out, figure_path, data, choice)


def search_real(pair, domains: dict[str, list[Prompt]], configs: list[DecodeConfig], repeats: int,
                progress: StageProgress | None = None) -> dict[str, pd.DataFrame]:
    """Sampling (no replay): every policy of the grid, timed on every domain's prompts."""
    from dspark_bench.runner import RunnerSettings, run

    samples = {}
    for domain, prompts in domains.items():
        step = stage_steps(progress, f"searching {domain}", len(prompts) * len(configs))
        samples[domain] = run(pair, prompts, configs, RunnerSettings(repeats=repeats), progress=step).samples
    return samples
