"""A run's whole configuration: what `run` decodes, with what, and how it is timed.

One frozen dataclass, commented field by field: the workload a sweep shares (harness.workload)
and the policies the run decodes. `run` builds it from flags, writes it whole into
run.json, and `dspark-bench run --config results/<id>/run.json` runs it again; `regress` re-runs
a baseline through the same path. A run folder made before run.json kept its config is read
back from the parts it did keep (configs, settings, models, prompts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from dspark_bench import schedules
from dspark_bench.config import KNOBS, LEARNED, DecodeConfig, expand, from_dict, with_defaults
from dspark_bench.decoding import budget, capture, controllers, learned_signal
from dspark_bench.decoding.budget import row_rule
from dspark_bench.decoding.rules import expressible, round_policies
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.errors import DsparkError
from dspark_bench.harness.calibration_file import load_calibration
from dspark_bench.harness.hf_cost_model import priced_hf
from dspark_bench.harness.models import check_depth_reach, context_warning, load_pair
from dspark_bench.harness.runner import RunnerSettings, planned_samples, run_to_folder, stage_steps
from dspark_bench.harness.workload import Served, Workload, check_served, served
from dspark_bench.results import check_writable, read_json
from dspark_bench.tasks import load_prompts, pair_of
from dspark_bench.tasks.prompts import Prompt, encode, prompts_fingerprint

# The order a run's grid is crossed in (the last varies fastest): the batch size outermost, then
# the knobs in the order runs have always decoded them; any other knob after these.
GRID_ORDER = ("batch_size", "metric", "schedule", "threshold", "gamma_max", "min_draft_len", "semantics", "draft_mode",
              "drafter")


@dataclass(frozen=True)
class RunConfig(Workload, Served):
    """A run: a workload (models, prompts, verification, timing: harness.workload) and the
    policies it decodes; given a load (harness.workload.Served), served for real beside replay's
    prediction (harness/served_run.py)."""

    # --- the policies: every combination of the grid's values (knob -> values, a sweep spec's
    # `space` in the same shape; config.expand), the knobs it leaves out at their defaults ...
    grid: dict = field(default_factory=dict)
    # ... unless `policies` lists whole DecodeConfig dicts (a re-run of a run whose policies
    # were not a grid: a calibration's, a benchmark's chosen few)
    policies: tuple[dict, ...] | None = None
    calibration: str | None = None  # a calibration file: each prompt gets its domain's policy
    # --- the speculative decoder timed against the baseline: ours, HF assisted generation
    # (`generate(assistant_model=…)`) running each policy under HF's own rule, or llama.cpp's
    # llama-server beside ours (engines/llamacpp_run.py)
    decoder: str = "ours"

    def __post_init__(self) -> None:
        check(self)

    def values(self, knob: str) -> tuple:
        """The grid's values of `knob` (its default alone where the grid leaves it out)."""
        return tuple(self.grid.get(knob, (KNOBS[knob].default,)))

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self.values("batch_size")

    def space(self) -> dict:
        """The grid's axes as a search space (config.expand's), crossed in GRID_ORDER: the knobs
        a run has always crossed, any other knob given several values, and the knobs a schedule reads
        (set in the base, the default schedule would drop them: the threshold schedule, a depth policy)."""
        read = {name for schedule in schedules.SCHEDULES.values() for name in schedule.reads}
        others = [name for name, values in self.grid.items() if name not in GRID_ORDER
                  and (len(values) > 1 or name in read)]
        return {name: self.values(name) for name in (*GRID_ORDER, *others)}

    def fixed_knobs(self) -> dict:
        """The grid's other knobs, one value each: every policy's, checked together in its base."""
        axes = self.space()
        return {name: values[0] for name, values in self.grid.items() if name not in axes}

    def decode_configs(self, task_tokens: int | None = None) -> list[DecodeConfig]:
        """The policies this run decodes: its explicit list, or every combination of the grid."""
        tokens = self.tokens(task_tokens)
        if self.policies is not None:
            def sizes(policy: dict):  # a policy naming no batch size runs at each of the run's
                return [policy["batch_size"]] if "batch_size" in policy else self.batch_sizes

            compiled = {"compiled": True} if self.values("compiled") == (True,) else {}
            return [from_dict({**policy, "batch_size": b, "max_new_tokens": policy.get("max_new_tokens", tokens),
                               **compiled})
                    for policy in self.policies for b in sizes(policy)]
        base = DecodeConfig.of(topk=self.topk, temperature=self.temperature, top_p=self.top_p, max_new_tokens=tokens,
                               seed=self.seed, **self.fixed_knobs())
        return expand(self.space(), base)

    def settings(self) -> RunnerSettings:
        return self.runner_settings(self.decoder)


def check(config: RunConfig) -> None:
    """Refuse a config that cannot run, before anything loads."""
    sources = [name for name in ("task", "dataset") if getattr(config, name)]
    if len(sources) != 1:
        raise DsparkError("pass exactly one of --task, --dataset or --prompts"
                          + (f" (got {' and '.join('--' + s for s in sources)})" if sources else ""))
    config.check_workload()
    check_grid(config.grid)
    if max(config.batch_sizes) > 1 and config.turns == "all":
        raise DsparkError("--turns all decodes each turn on the previous answer, one prompt at a time; "
                          "use --batch-size 1 with it")
    if config.decoder not in ("ours", "hf", "llamacpp"):
        raise DsparkError(f"--decoder must be ours, hf or llamacpp (got {config.decoder!r})")
    if config.decoder == "hf" and config.ignore_eos:
        raise DsparkError("--decoder hf cannot ignore EOS (HF generate falls back to the model's own EOS); "
                          "drop --ignore-eos")
    if config.decoder == "hf" and max(config.batch_sizes) > 1:
        raise DsparkError("--decoder hf decodes one request at a time (HF assisted generation has no batching); "
                          "use --batch-size 1")
    if max(config.batch_sizes) > 1 and "verify-side" in config.values("draft_mode"):
        raise DsparkError("--draft-mode verify-side runs at batch size 1 only; use --batch-size 1")
    if config.calibration is not None and config.policies is not None:
        raise DsparkError("a calibration chooses the policies; a run cannot also list them")
    if config.calibration is not None:
        load_calibration(config.calibration)  # a missing or broken file ends here, before the prompts are read
    if config.policies is not None and not config.policies:
        raise DsparkError("the run lists no policy to decode")
    configs = config.decode_configs()  # every policy of the grid is valid (one clear line if not)
    if served(config):
        check_served(config, configs)
    if config.calibration is None:  # every knob given does something to one of them (a calibration's: its own)
        config.check_needs(configs, config.grid)
    if config.decoder == "hf" and any(c.verification.compiled or c.verification.draft_mode != "early-stop"
                                      for c in configs):
        raise DsparkError("--decoder hf runs HF's own generate loop: drop --compile and --draft-mode")
    if config.decoder == "hf" and any(c.drafting.drafter != "model" for c in configs):
        raise DsparkError("--decoder hf runs HF's assisted generation with the draft model: drop --drafter")
    if config.decoder == "hf":
        for c in configs:
            if expressible(c, "hf"):
                raise DsparkError(f"--decoder hf runs HF's own rule, which cannot express {c.label()} (it needs "
                                  f"{'; '.join(expressible(c, 'hf'))}); use --metric top1 --min-draft-len 0 "
                                  "--semantics hf, or --schedule fixed")
    for c in configs:  # the model exists, reads, and has the metric: before any model loads
        for bucket in (p for p in round_policies(c) if schedules.of(p).cost_aware):  # a depth policy's entries too
            row_rule(bucket)
        if schedules.of(c).whole_batch:
            budget.rule_for(c)  # and times the policy's batch size
        if schedules.of(c).priced:
            controllers.start(c)  # its controller's step costs: given, readable, at its batch size
    for signal_model in {c.stopping.signal_model for c in configs if LEARNED in schedules.round_metrics(c)}:
        learned_signal.load(signal_model)  # a missing or broken file fails here, before any model loads


def check_grid(grid: dict) -> None:
    """The grid names knobs (config.KNOBS), each with at least one value; whether the values
    are in range is each policy's own check (knobs.check_declared), when it is built."""
    if not isinstance(grid, dict):
        raise DsparkError(f"a run's grid maps knobs to their values (got {grid!r})")
    unknown = sorted(set(grid) - set(KNOBS))
    if unknown:
        raise DsparkError(f"unknown decode setting(s) {', '.join(unknown)}; known: {', '.join(KNOBS)}")
    for name, values in grid.items():
        if not isinstance(values, (list, tuple)) or not values:
            raise DsparkError(f"--{name.replace('_', '-')}: give at least one value (got {values!r})")


def from_config_dict(values: dict, where: str = "run config") -> RunConfig:
    """A RunConfig from a mapping (run.json's "config"), refusing keys it does not know."""
    values = grid_of_old(renamed(values))
    known = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise DsparkError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    policies = values.get("policies")
    try:
        grid = {name: tuple(knob_values) for name, knob_values in (values.get("grid") or {}).items()}
        return RunConfig(**{**values, "grid": grid, "policies": tuple(policies) if policies is not None else None,
                            "arrival_rates": tuple(values.get("arrival_rates") or ())})
    except (TypeError, AttributeError) as err:
        raise DsparkError(f"{where}: {err}") from None


# The knobs a run.json kept beside its workload before the grid held them: a list of values each
# (batch sizes under their plural), or one value.
OLD_GRID_LISTS = ("metric", "schedule", "threshold", "gamma_max", "min_draft_len", "semantics", "draft_mode", "drafter")
OLD_GRID_VALUES = ("goodput_model", "budget_layout", "signal_model", "threshold_start", "threshold_end", "ngram_min",
                   "ngram_max", "compiled")


def grid_of_old(values: dict) -> dict:
    """run.json's config with the knobs it kept as fields of their own (before the grid) in its grid."""
    if not any(name in values for name in (*OLD_GRID_LISTS, *OLD_GRID_VALUES, "batch_sizes")):
        return values
    values, grid = dict(values), dict(values.get("grid") or {})
    if "batch_sizes" in values:
        grid["batch_size"] = values.pop("batch_sizes")
    for name in OLD_GRID_LISTS:
        if name in values:
            grid[name] = values.pop(name)
    for name in OLD_GRID_VALUES:
        if name in values:
            grid[name] = [values.pop(name)]
    return {**values, "grid": grid}


# Keys a run.json written before a rename still carries: the old name -> the new one.
RENAMED = {"engine": "decoder"}


def renamed(values: dict) -> dict:
    """`values` with every old key under its new name (run.json of an earlier version)."""
    return {RENAMED.get(key, key): value for key, value in values.items()}


def shipped(name: str | None) -> bool:
    # A run made with the reference pair records its install path, another machine's in CI;
    # the fingerprints prove the weights are the same ones.
    parts = Path(name or "").parts
    return any(parts[i : i + 3] == ("dspark_bench", "reference", "weights") for i in range(len(parts)))


def from_run_info(info: dict, where: str = "run file") -> RunConfig:
    """The config a run folder's run.json describes: its own "config" where it kept one, else
    rebuilt from its configs, settings, models and prompts (run.json before it kept a config)."""
    if not isinstance(info, dict) or info.get("kind", "run") != "run":
        raise DsparkError(f"{where} is not a run's run.json (a sweep continues with `sweep --resume`)")
    if info.get("config"):
        return from_config_dict(info["config"], where)
    if info.get("assignment") is not None:
        raise DsparkError(f"{where} is a calibrated run made before run.json kept its config; run it again "
                          "with --calibration")
    models, prompts, settings = info.get("models") or {}, info.get("prompts") or {}, info.get("settings") or {}
    both_shipped = shipped(models.get("target")) and shipped(models.get("draft"))
    known = {f.name for f in dataclasses.fields(RunConfig)}
    runner = {key: value for key, value in renamed(settings).items() if key in known}
    if not (prompts.get("task") or prompts.get("dataset")):
        raise DsparkError(f"{where} names neither a task nor a dataset, so it cannot be re-run")
    return from_config_dict({
        "target": None if both_shipped else models.get("target"),
        "draft": None if both_shipped else models.get("draft"),
        "device": str(models.get("device", "auto")).split(":")[0], "dtype": models.get("dtype", "auto"),
        "task": prompts.get("task"), "dataset": None if prompts.get("task") else prompts.get("dataset"),
        "split": prompts.get("split", "train"), "limit": prompts.get("count"),
        "policies": list(info.get("configs") or []), **runner,
    }, where)


def resolve_prompts(config: RunConfig) -> tuple[list[Prompt], dict, int | None]:
    """(prompts, where they came from as run.json records it, the task's max_new_tokens or None)."""

    return load_prompts(config.task, config.dataset, config.split, config.prompt_field, config.category_field,
                        config.limit)


# --- running a config ------------------------------------------------------------------------------


@dataclasses.dataclass
class Planned:
    """A config resolved into what the runner needs: models loaded, prompts read, policies built."""

    config: RunConfig
    pair: object  # models.ModelPair
    prompts: list[Prompt]
    configs: list[DecodeConfig]
    source: dict  # where the prompts came from, as run.json records it
    assignment: list[list[int]] | None = None  # with a calibration: each prompt's policy indexes

    @property
    def samples(self) -> int:
        return planned_samples(self.prompts, self.configs, self.config.settings(), self.assignment)


def plan_run(config: RunConfig) -> Planned:
    """Read the prompts, build the policies and load the models (cheap checks first)."""
    config.prepare_host()
    prompts, source, task_tokens = resolve_prompts(config)
    configs, assignment = config.decode_configs(task_tokens), None
    if config.calibration is not None:
        configs, assignment = calibrated_configs(config.calibration, prompts, configs)
    pair = load_pair(config.target, config.draft, config.device, config.dtype, config.heads,
                     drafters={c.drafting.drafter for c in configs}, pair=pair_of(config.task))
    check_learned_models(pair, configs)
    check_depth_reach(pair, prompts, max((c.verification.max_new_tokens for c in configs), default=0), configs,
                      config.chat_template)
    if any(c.drafting.drafter == "heads" for c in configs):
        pair.heads  # noqa: B018 — load (and check) the heads before anything runs
    if config.calibration is not None:
        load_calibration(config.calibration).check_models(pair.describe())
    return Planned(config, pair, prompts, configs, source, assignment)


def check_learned_models(pair, configs: list[DecodeConfig]) -> None:
    """A learned signal decodes only with the models it was fitted on, and in float64 (not on MPS)."""
    files = {c.stopping.signal_model for c in configs if LEARNED in schedules.round_metrics(c)}
    if files and pair.device.type == "mps":
        raise DsparkError("the learned metric computes in float64, which MPS lacks: "
                          "use --device cpu, or another metric")
    for path in files:
        fitted = dict(learned_signal.load(path).models)
        for key, mine in zip(("target_fingerprint", "draft_fingerprint"), pair.fingerprints):
            if fitted.get(key) and fitted[key] != mine:
                raise DsparkError(f"the learned signal {path!r} was fitted on other models ({key} {fitted[key]}, "
                                  f"this pair's {mine}): run a replay sweep on these models")


def calibrated_configs(path, prompts: list[Prompt],
                       bases: list[DecodeConfig]) -> tuple[list[DecodeConfig], list[list[int]]]:
    """The distinct calibrated policies, and for each prompt the indexes of its own: one per
    base (one base per batch size, each taking the calibration made nearest its batch size)."""

    calibration = load_calibration(path)
    configs: list[DecodeConfig] = []
    assignment: list[list[int]] = [[] for _ in prompts]
    for base in bases:
        per_prompt = calibration.for_batch_size(base.batching.batch_size).configs_for(prompts, base=base)
        for assigned, config in zip(assignment, per_prompt):
            if config not in configs:
                configs.append(config)
            assigned.append(configs.index(config))
    return configs, assignment


def check_rerun(planned: Planned, original: dict, where: str) -> None:
    """A re-run from run.json must decode what the original did: same prompts, same policies."""

    before = (original.get("prompts") or {}).get("fingerprint")
    if before and prompts_fingerprint(planned.prompts) != before:
        raise DsparkError(f"the prompts of {where} changed since it ran (fingerprint {before} → "
                          f"{prompts_fingerprint(planned.prompts)}); it cannot be re-run as it was")
    if original.get("configs") and ([c.to_dict() for c in planned.configs]
                                    != [with_defaults(c) for c in original["configs"]]):
        raise DsparkError(f"the policies {where} describes no longer build the same configs; it cannot be re-run")


def execute(config: RunConfig, out: Path, progress=None, say=None, planned: Planned | None = None):
    """Run `config` into a new run folder under `out`: returns (folder, per-config summary table).

    `progress(stage, done, total)` follows the decoding; `say(line)` hears the plan first.
    """

    check_writable(out)  # before models load
    planned = planned or plan_run(config)
    longest = max((c.verification.max_new_tokens for c in planned.configs), default=0)
    warning = context_warning(planned.pair, planned.prompts, longest, config.chat_template) if say else None
    if warning:
        say(warning)
    step = stage_steps(progress, "decoding", planned.samples)
    folder, table = run_to_folder(planned.pair, planned.prompts, planned.configs, out, config.settings(),
                                  planned.source, progress=step, assignment=planned.assignment, say=say,
                                  run_config=config.to_dict(), precision=(config.precision, config.precision_budget_s))
    if config.decoder == "hf" and all(c.greedy for c in planned.configs) and config.calibration is None:
        priced_hf(planned, folder, config.settings(), progress, say)  # replay priced on HF's own costs, beside ours
    return folder, table


def rerun_from(run_file: Path, out: Path, progress=None, say=None, serve_load=None):
    """`run --config results/<id>/run.json`: the run that file describes, again; `serve_load` runs it
    where it names a load (harness/served_run.execute_served, which imports this module)."""
    check_writable(out)  # before models load
    info = read_json(Path(run_file), "run file")
    config = from_run_info(info, str(run_file))
    planned = plan_run(config)
    check_rerun(planned, info, str(run_file))
    if served(config) and serve_load is None:
        raise DsparkError(f"{run_file} is a run under load: run it with `dspark-bench run --config`")
    return (serve_load if served(config) else execute)(config, out, progress, say, planned)


def decode_once(text: str, config: DecodeConfig, target: str | None = None, draft: str | None = None,
                device: str = "auto", dtype: str = "auto", chat_template: str = "auto",
                calibration: Path | None = None, domain: str | None = None, heads: str | None = None,
                eager: bool = False):
    """`dspark-bench decode`: one speculative generation of `text` (with a calibration: the policy
    of `domain`, or the global one). Returns (pair, the policy used, DecodeResult)."""

    if calibration is not None:
        config = load_calibration(calibration).policy_for(domain or "", strict=domain is not None, base=config)
    controllers.start(config)  # a controller's own files (vllm-adaptive's step costs), before the models load
    pair = load_pair(target, draft, device, dtype, heads, drafters={config.drafting.drafter})
    check_depth_reach(pair, [Prompt("prompt", text)], config.verification.max_new_tokens, [config], chat_template)
    config = capture.captured([config], pair.device, eager, (pair.target, pair.draft))[0]
    ids = encode(pair.tokenizer, text, chat_template)
    return pair, config, speculative_decode(pair.target, pair.drafter_for(config), ids, config, pair.eos_ids)
