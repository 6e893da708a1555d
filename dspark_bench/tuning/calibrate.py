"""Per-domain calibration: the best policy for each kind of traffic, in a file the decoder loads.

The draft is surer of itself on some text than on other text (code vs prose), so the threshold
that is best for one domain is wrong for another. For every domain (a task, or a category of a
user's dataset) calibration finds the best policy of a sweep's search space, finds the best
single *global* policy over all domains together, and measures both on each domain's prompts:

    choose      replay (greedy or sampled): record each domain once, simulate every policy, rank;
                real runs otherwise; the global policy maximises the objective over the
                union of the domains' prompts (per-domain totals summed, then ratios taken)
    confirm     a timed `runner.run` of each domain's policy and of the global policy
    write       calibration YAML (atomic, never overwritten without `force`) + a PNG figure, drawn
                by the `draw` the caller hands in (reporting's plots: tuning draws nothing)

`load_calibration(path)` reads the file back for the decoder: `policy_for(domain)` and
`configs_for(prompts)`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import DEFAULT_MAX_NEW_TOKENS, POLICY_FIELDS, DecodeConfig
from dspark_bench.decoding import capture
from dspark_bench.decoding.static_batch_lm import capacity_for
from dspark_bench.engines.profiles import write_calibration_profiles
from dspark_bench.errors import DsparkError
from dspark_bench.harness.calibration_file import (
    SCHEMA_VERSION,
    Calibration,
    DomainCalibration,
    check_output,
    load_calibration,
    parse_calibration,
    write_calibration,
)
from dspark_bench.harness.in_decode import one_surface
from dspark_bench.harness.models import load_pair
from dspark_bench.harness.runner import RunnerSettings, StageProgress, run, stage_steps
from dspark_bench.measure import sampled_recording
from dspark_bench.measure.cost_model import halfway, measure_surface
from dspark_bench.measure.recording import record
from dspark_bench.metrics import summarize
from dspark_bench.objectives import rank
from dspark_bench.replay.continuations import Continuations, open_for
from dspark_bench.results import environment
from dspark_bench.tasks import get_task, load_dataset_prompts, load_task, pair_of
from dspark_bench.tasks.prompts import Prompt, encode, prompts_fingerprint

# Choosing (pure) is domain_choice.py's, the file itself (schema, loading, writing)
# harness/calibration_file.py's; the decoder's users find them here too.
from dspark_bench.tuning.domain_choice import Choice, choose_from_records, choose_from_samples
from dspark_bench.tuning.replay_sweep import needs_draft_model
from dspark_bench.tuning.spec import SweepSpec, base_config, evaluation_for, points
from dspark_bench.tuning.spec_files import flag_overrides, load_spec

__all__ = ["Calibration", "Choice", "DomainCalibration", "calibrate_domains", "check_output", "choose_from_records",
           "choose_from_samples", "load_calibration", "parse_calibration", "write_calibration"]

QUANTILES = (10, 25, 50, 75, 90)


def confidence_quantiles(rec, metric: str = "top1") -> dict[str, float]:
    """Quantiles of the draft's confidence over every proposal the record holds for a domain
    (rollout steps 1..gamma_record from every position of the target's continuation)."""
    inside = np.arange(rec.rollout.shape[1])[None, :] < rec.lengths[:, None]  # [P, N]
    values = rec.confidences[metric][inside].ravel()
    if values.size == 0:
        return {f"p{q}": float("nan") for q in QUANTILES}
    return {f"p{q}": round(float(v), 4) for q, v in zip(QUANTILES, np.percentile(values, QUANTILES))}


# --- the figure ---------------------------------------------------------------------------------

# What draws the figure from threshold_curves' table, its y label and the global threshold: a
# plot of the layer above (reporting.plots.domain_threshold_curves), handed in by the caller.
Draw = Callable[[pd.DataFrame, str, float], object]


def threshold_curves(choice: Choice) -> pd.DataFrame:
    """Per domain: the objective vs threshold along the domain's best (metric, schedule, gamma_max,
    min_draft_len) — one line per domain; `best` marks the domain's chosen point."""
    frames = []
    for domain, table in choice.tables.items():
        candidates = rank(table[schedules.where(table, one_threshold=True)], choice.objective, choice.column)
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


# --- the whole job: prompts, records, choice, confirmation, file ---------------------------------


def domain_prompts(spec: SweepSpec, tasks: list[str] | None = None) -> dict[str, list[Prompt]]:
    """Domain -> prompts: one domain per task (its `domain`), or one per category of the dataset.

    `spec.limit` is the number of prompts per domain.
    """
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
    if spec.max_new_tokens or not tasks:
        return spec.max_new_tokens
    lengths = {get_task(name).max_new_tokens for name in tasks}
    return lengths.pop() if len(lengths) == 1 else DEFAULT_MAX_NEW_TOKENS


@dataclass
class Calibrated:
    """What `calibrate_domains` did: the file, its content and the choice behind it."""
    path: Path
    figure: Path | None  # None: no `draw` was handed in
    data: dict
    choice: Choice
    profiles: Path | None = None  # the acceptance profiles' folder; None: why in profiles_note, or no record
    profiles_note: str | None = None


def record_domains(pair, domains: dict[str, list[Prompt]], base: DecodeConfig, gamma: int,
                   progress: StageProgress | None = None, batch_sizes=(1,),
                   source: Continuations | None = None, paths: int = SweepSpec.paths,
                   compiled: bool = False, in_decode: frozenset[int] | None = None) -> tuple[dict, object]:
    """A replay record per domain (of `base`'s drafter), and one cost surface at `batch_sizes`
    (timed on the first domain's first prompt); the target's continuations from `source` (an
    engine's continuations files, checked) where given, else decoded here (at a temperature > 0,
    `paths` sampled paths per prompt); `compiled`: priced on compiled passes (B > 1 on static
    caches as wide as a batch of every domain's prompts would take); `in_decode` (the ids that end
    a sequence): priced inside running decodes (harness/in_decode.py), None: passes timed alone."""
    models, records, first_context, rows, every = pair.describe(), {}, None, [], []
    for domain, prompts in domains.items():
        ids = [encode(pair.tokenizer, p.text) for p in prompts]
        every += ids
        info = {"models": models, "prompts_fingerprint": prompts_fingerprint(prompts), "domain": domain,
                "prompt_ids": [p.id for p in prompts], **({"continuations": source.describe()} if source else {})}
        given = [source.continuation(p.id) for p in prompts] if source else None
        steps = stage_steps(progress, f"recording {domain}", len(ids))
        if base.greedy:
            rec = record(pair, ids, base.verification.max_new_tokens, gamma, base.stopping.topk, info,
                         progress=steps, drafter=base.drafting, continuations=given)
        else:  # sampled paths at the spec's temperature (replay/sampled.py)
            rec = sampled_recording.record_sampled(pair, ids, base, gamma, paths, base.stopping.topk, info, steps,
                                         drafter=base.drafting)
        records[domain] = rec
        rows += halfway(rec, ids)  # a batch of the surface holds the domains' prompts (cost_model.halfway)
        if first_context is None:
            # Timed with the cache at a realistic length: a prompt plus half its output.
            first_context = ids[0] + rec.continuation[0, : int(rec.lengths[0]) // 2].tolist()
    if progress:
        progress("timing the cost model", 0, 1)
    order = np.random.default_rng(0).permutation(len(rows))  # the domains mixed, as a server's batch is
    rows = [rows[i] for i in order]
    surface = measure_surface(pair, first_context, gamma, batch_sizes, drafters=(base.drafting.drafter,), contexts=rows,
                              compiled=compiled, width=capacity_for(every, base.verification.max_new_tokens, gamma))
    if in_decode is None:
        return records, surface
    return records, one_surface(pair, every, base, surface, gamma, in_decode, compiled)


def measure_domains(pair, domains: dict[str, list[Prompt]], chosen: dict[str, DecodeConfig],
                    global_policy: DecodeConfig, settings: RunnerSettings,
                    progress: StageProgress | None = None) -> dict[str, pd.DataFrame]:
    """Timed runs of each domain's policy and the global one on that domain's prompts.

    Returns domain -> samples with `role` "domain" / "global" (one run, so a domain whose
    policy is the global one has one measurement for both)."""
    samples = {}
    for domain, prompts in domains.items():
        configs = list(dict.fromkeys([chosen[domain], global_policy]))
        step = stage_steps(progress, f"timing {domain}", len(prompts) * len(configs))
        output = run(pair, prompts, configs, settings, progress=step).samples
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
                     samples: dict[str, pd.DataFrame], records: dict | None, models: dict, evaluation: str,
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
        "evaluation": evaluation,
        # The traffic's sampling the policies were chosen for (temperature 0: greedy).
        "sampling": {"temperature": global_policy.verification.temperature, "top_p": global_policy.verification.top_p},
        "max_new_tokens": global_policy.verification.max_new_tokens,
        "cost_model": cost.to_dict() if cost is not None else None,
        "global": {"policy": policy_dict(global_policy), "label": global_policy.label(),
                   search: round(choice.value(global_id), 4),
                   "measured": _measured(everything[everything["role"] == "global"])},
        "domains": {},
        "figure": figure_name,
    }
    for domain, config in chosen.items():
        config_id = choice.configs.index(config)
        mine, theirs = (samples[domain][samples[domain]["role"] == "domain"],
                        samples[domain][samples[domain]["role"] == "global"])
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
            "shift": {"threshold": round(config.stopping.threshold, 6),
                      "global_threshold": round(global_policy.stopping.threshold, 6)},
        }
        if records is not None:
            entry["shift"]["confidence_top1"] = confidence_quantiles(records[domain])
        data["domains"][domain] = entry
    return data


def calibrate_domains(spec: SweepSpec, out: Path, tasks: list[str] | None = None, force: bool = False,
                      progress: StageProgress | None = None, pair=None,
                      domains: dict[str, list[Prompt]] | None = None, draw: Draw | None = None) -> Calibrated:
    """Calibrate a policy per domain (each task in `tasks`, else each category of `spec.dataset`)
    over `spec`'s search space, confirm with timed runs, and write the calibration file `out`.

    `domains` (from `domain_prompts`) skips loading the prompts again; `pair` the models; `draw`
    (reporting.plots.domain_threshold_curves) makes the figure written beside the file."""
    check_output(out, force)  # fail before any model loads
    if (spec.chat_template, spec.batching, spec.warmup) != ("auto", "refill", 1):
        raise DsparkError("calibrate decodes with the default chat template, batching and warm-up; drop "
                          "chat_template / batching / warmup from the spec (run takes them)")
    evaluation = evaluation_for(spec)
    base = base_config(spec, _max_new_tokens(spec, tasks or ([spec.task] if spec.task and not spec.dataset else None)))
    configs = points(spec, base)
    drafters = dict.fromkeys(c.drafting for c in configs)
    if len(drafters) > 1:
        raise DsparkError("a calibration chooses one drafter's policies: give one drafter (and one n-gram range) "
                          "— compare drafters with `dspark-bench sweep --drafter ...` first")
    domains = domains if domains is not None else domain_prompts(spec, tasks)
    empty = [d for d, p in domains.items() if not p]
    if not domains or empty:
        raise DsparkError(f"no prompts for domain(s) {', '.join(empty)}" if empty else "no domains to calibrate")
    pair = pair or load_pair(spec.target, spec.draft, spec.device, spec.dtype, spec.heads,
                             drafters={c.drafting.drafter for c in configs},
                             pair=pair_of(",".join(tasks) if tasks else (None if spec.dataset else spec.task)))
    batch_sizes = sorted({c.batching.batch_size for c in configs})
    if spec.continuations is not None and evaluation != "replay":
        raise DsparkError("--continuations feeds replay's records: a real calibration decodes every policy here")
    if spec.continuations is not None and spec.temperature > 0:
        raise DsparkError("--continuations holds the target's greedy continuations: a calibration at a temperature "
                          "samples its own paths here (drop --continuations, or --temperature)")
    records, surface = None, None
    if evaluation == "replay":
        needs_draft_model(pair)
        source = None if spec.continuations is None else domain_continuations(spec, pair, domains, base)
        records, surface = record_domains(pair, domains, configs[0], max(c.stopping.gamma_max for c in configs),
                                          progress, batch_sizes, source, spec.paths,
                                          capture.priced_captured(configs, pair.device, spec.eager,
                                                                  (pair.target, pair.draft)),
                                          None if spec.isolated_prices else pair.eos_ids)
    # One calibration per batch size: which policy wins depends on what a step costs at B. The
    # file's own global/domains are the smallest B's; the others go under by_batch_size.
    parts = [calibrate_at(pair, domains, [c for c in configs if c.batching.batch_size == b], spec, records, surface,
                          evaluation, progress) for b in batch_sizes]
    out, figure_path = check_output(out, force)
    data, choice = parts[0]
    data["figure"] = figure_path.name if draw else None
    if len(parts) > 1:
        data["by_batch_size"] = {int(b): {key: part[0][key] for key in ("global", "domains", "cost_model")}
                                 for b, part in zip(batch_sizes[1:], parts[1:])}
    data["spec"] = {**spec.to_dict(), "tasks": tasks}  # the search that chose these policies
    ylabel = {"predicted_speedup": "predicted speedup (replay + cost model)"}.get(choice.column, choice.column)
    if len(parts) > 1:
        ylabel += f", batch size {batch_sizes[0]}"
    figure = draw(threshold_curves(choice), ylabel, choice.best().stopping.threshold) if draw else None
    profiles, note = write_calibration_profiles(out, records, choice.best, pair.describe(), force)
    data["profiles"] = profiles.name if profiles else None
    write_calibration(data, figure, out, force)
    return Calibrated(out, figure_path if draw else None, data, choice, profiles, note)


def domain_continuations(spec: SweepSpec, pair, domains: dict[str, list[Prompt]], base: DecodeConfig) -> Continuations:
    """The spec's continuations files, checked against every domain's prompts before any is recorded."""
    prompts = [p for chosen in domains.values() for p in chosen]
    ids = [encode(pair.tokenizer, p.text) for p in prompts]
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    return open_for(spec.continuations, prompts, ids, base.verification.max_new_tokens, pair.eos_ids, vocab)


def calibrate_at(pair, domains: dict[str, list[Prompt]], configs: list[DecodeConfig], spec: SweepSpec, records,
                 surface, evaluation: str, progress: StageProgress | None = None) -> tuple[dict, Choice]:
    """Choose and confirm the policies of one batch size: (the calibration's content, the choice)."""
    objective, batch_size = spec.objective[0], configs[0].batching.batch_size
    if evaluation == "replay":
        cost = surface if batch_size > 1 else surface.at(1)
        choice = choose_from_records(records, configs, cost, objective)
    else:
        cost = None
        choice = choose_from_samples(search_real(pair, domains, configs, timing_of(spec), progress), configs, objective)
    chosen = {domain: choice.best(domain) for domain in domains}
    global_policy = choice.best()
    samples = measure_domains(pair, domains, chosen, global_policy, timing_of(spec), progress)
    model = surface.at(batch_size) if surface is not None else None
    return calibration_data(choice, chosen, global_policy, samples, records, pair.describe(), evaluation, model), choice


def timing_of(spec: SweepSpec) -> RunnerSettings:
    """How a calibration times its runs: the spec's repeats, captured on CUDA unless --eager."""
    return RunnerSettings(repeats=spec.repeats, eager=spec.eager)


def search_real(pair, domains: dict[str, list[Prompt]], configs: list[DecodeConfig], settings: RunnerSettings,
                progress: StageProgress | None = None) -> dict[str, pd.DataFrame]:
    """Sampling (no replay): every policy of the grid, timed on every domain's prompts."""
    samples = {}
    for domain, prompts in domains.items():
        step = stage_steps(progress, f"searching {domain}", len(prompts) * len(configs))
        samples[domain] = run(pair, prompts, configs, settings, progress=step).samples
    return samples


def calibrate_command(tasks: str | None, dataset: str | None, spec_path: Path | None, flags: dict, out: Path,
                      force: bool = False, progress: StageProgress | None = None,
                      draw: Draw | None = None) -> Calibrated:
    """`dspark-bench calibrate`: --tasks (one domain each) or --dataset (one per category), over
    the search space of `spec_path` with `flags` overriding it; checked before models load."""
    names = [name.strip() for name in (tasks or "").split(",") if name.strip()]
    if names and dataset:
        raise DsparkError("pass --tasks or --dataset, not both")
    if tasks is not None and not names:
        raise DsparkError("--tasks is empty; name at least one task, e.g. --tasks code,prose")
    if spec_path is None and not names and not dataset:
        raise DsparkError("pass --tasks, --dataset, or a --spec that names a task or dataset")
    space = {name: flags.pop(name, None)
             for name in ("metric", "threshold", "gamma_max", "min_draft_len", "batch_size")}
    overrides = flag_overrides(flags, space)
    if names or dataset:
        overrides.update(task=names[0] if names else None, dataset=None if names else dataset)
    spec = load_spec(spec_path, overrides)
    check_output(out, force)  # before models load or prompts are read
    domains = domain_prompts(spec, names or None)
    return calibrate_domains(spec, out, tasks=names or None, force=force, progress=progress, domains=domains,
                             draw=draw)
