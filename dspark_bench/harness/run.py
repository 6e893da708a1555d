"""A run's whole configuration: what `run` decodes, with what, and how it is timed.

One frozen dataclass, commented field by field: the workload a sweep shares (harness.workload)
and the policies the run decodes. `run` builds it from flags, writes it whole into
run.json, and `dspark-bench run --config results/<id>/run.json` runs it again; `regress` re-runs
a baseline through the same path. A run folder made before run.json kept its config is read
back from the parts it did keep (configs, settings, models, prompts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from dspark_bench.config import COST_AWARE, DEFAULTS, LEARNED, DecodeConfig, expand, from_dict, with_defaults
from dspark_bench.decoding import budget, learned_signal
from dspark_bench.decoding.budget import row_rule
from dspark_bench.decoding.engine import speculative_decode
from dspark_bench.decoding.schedule import expressible
from dspark_bench.errors import DsparkError
from dspark_bench.harness.calibration_file import load_calibration
from dspark_bench.harness.models import load_pair
from dspark_bench.harness.priced import priced_hf
from dspark_bench.harness.runner import RunnerSettings, planned_samples, run_to_folder, stage_steps
from dspark_bench.harness.workload import Workload
from dspark_bench.prompts import Prompt, encode, prompts_fingerprint
from dspark_bench.results import check_writable, read_json
from dspark_bench.tasks import load_prompts


@dataclass(frozen=True)
class RunConfig(Workload):
    """A run: a workload (models, prompts, verification, timing: harness.workload) and the
    policies it decodes."""

    # --- the policy grid: every combination of these lists runs (config.expand) ...
    metric: tuple[str, ...] = (DEFAULTS.stopping.metric,)
    schedule: tuple[str, ...] = (DEFAULTS.stopping.schedule,)
    threshold: tuple[float, ...] = (DEFAULTS.stopping.threshold,)
    gamma_max: tuple[int, ...] = (DEFAULTS.stopping.gamma_max,)
    min_draft_len: tuple[int, ...] = (DEFAULTS.stopping.min_draft_len,)
    semantics: tuple[str, ...] = (DEFAULTS.stopping.semantics,)  # whose rule: ours, HF's (keeps the failing token), llama.cpp's
    # where the rule cuts drafts ("early-stop" and/or "verify-side", each a policy of its own here)
    draft_mode: tuple[str, ...] = (DEFAULTS.verification.draft_mode,)
    # what drafts (drafters.py): the draft model, the target's heads, prompt lookup; each a policy
    # of its own here. Lookup matches n-grams of ngram_max down to ngram_min tokens.
    drafter: tuple[str, ...] = (DEFAULTS.drafting.drafter,)
    # --- ... each at every batch size (requests decoded together; B > 1 through the batched
    # engine, padded layout, refilled or drained as `batching` says)
    batch_sizes: tuple[int, ...] = (DEFAULTS.batching.batch_size,)
    # --- the grid's other knobs, one value each
    goodput_model: str = DEFAULTS.stopping.goodput_model  # the goodput schedule's model: a replay sweep's folder or its goodput_model.json
    budget_layout: str = DEFAULTS.stopping.budget_layout  # budget schedule: the layout it prices passes in (the engine runs padded)
    signal_model: str = DEFAULTS.stopping.signal_model  # metric learned: its fitted signal, a replay sweep's folder or its learned_signal.json
    threshold_start: float = DEFAULTS.stopping.threshold_start  # ramp schedule: threshold at draft position 1 ...
    threshold_end: float = DEFAULTS.stopping.threshold_end  # ... rising to this at gamma_max
    ngram_min: int = DEFAULTS.drafting.ngram_min
    ngram_max: int = DEFAULTS.drafting.ngram_max
    compiled: bool = DEFAULTS.verification.compiled  # compiled steps with a static cache (batch size 1)
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

    def space(self) -> dict:
        """The grid as a search space (config.expand's), in the order a run decodes it."""
        return {"batch_size": self.batch_sizes, "metric": self.metric, "schedule": self.schedule,
                "threshold": self.threshold, "gamma_max": self.gamma_max, "min_draft_len": self.min_draft_len,
                "semantics": self.semantics, "draft_mode": self.draft_mode, "drafter": self.drafter}

    def decode_configs(self, task_tokens: int | None = None) -> list[DecodeConfig]:
        """The policies this run decodes: its explicit list, or every combination of the grid."""
        tokens = self.tokens(task_tokens)
        if self.policies is not None:
            def sizes(policy: dict):  # a policy naming no batch size runs at each of the run's
                return [policy["batch_size"]] if "batch_size" in policy else self.batch_sizes

            return [from_dict({**policy, "batch_size": b, "max_new_tokens": policy.get("max_new_tokens", tokens),
                               **({"compiled": True} if self.compiled else {})})
                    for policy in self.policies for b in sizes(policy)]
        base = DecodeConfig.of(threshold_start=self.threshold_start, threshold_end=self.threshold_end, topk=self.topk,
                            temperature=self.temperature, top_p=self.top_p, max_new_tokens=tokens, seed=self.seed,
                            goodput_model=self.goodput_model, budget_layout=self.budget_layout,
                            signal_model=self.signal_model, compiled=self.compiled, ngram_min=self.ngram_min,
                            ngram_max=self.ngram_max)
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
    if not config.batch_sizes or any(not isinstance(b, int) or b < 1 for b in config.batch_sizes):
        raise DsparkError(f"--batch-size must be a whole number of at least 1 (got {list(config.batch_sizes)})")
    if max(config.batch_sizes) > 1 and config.turns == "all":
        raise DsparkError("--turns all decodes each turn on the previous answer, one prompt at a time; "
                          "use --batch-size 1 with it")
    if config.decoder not in ("ours", "hf", "llamacpp"):
        raise DsparkError(f"--decoder must be ours, hf or llamacpp (got {config.decoder!r})")
    if config.decoder == "hf" and config.ignore_eos:
        raise DsparkError("--decoder hf cannot ignore EOS (HF generate falls back to the model's own EOS); drop --ignore-eos")
    if config.decoder == "hf" and max(config.batch_sizes) > 1:
        raise DsparkError("--decoder hf decodes one request at a time (HF assisted generation has no batching); "
                          "use --batch-size 1")
    if max(config.batch_sizes) > 1 and (config.compiled or "verify-side" in config.draft_mode):
        raise DsparkError("--compile and --draft-mode verify-side run at batch size 1 only; use --batch-size 1")
    if config.calibration is not None and config.policies is not None:
        raise DsparkError("a calibration chooses the policies; a run cannot also list them")
    if config.policies is not None and not config.policies:
        raise DsparkError("the run lists no policy to decode")
    configs = config.decode_configs()  # every policy of the grid is valid (one clear line if not)
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
        if c.stopping.schedule in COST_AWARE:
            row_rule(c)
        if c.stopping.schedule == "budget":
            budget.rule_for(c)  # and times the policy's batch size
    for signal_model in {c.stopping.signal_model for c in configs if c.stopping.metric == LEARNED}:
        learned_signal.load(signal_model)  # a missing or broken file fails here, before any model loads


def from_config_dict(values: dict, where: str = "run config") -> RunConfig:
    """A RunConfig from a mapping (run.json's "config"), refusing keys it does not know."""
    values = renamed(values)
    known = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise DsparkError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    tuples = {name: tuple(value) for name, value in values.items()
              if isinstance(value, list) and name != "policies"}
    policies = values.get("policies")
    try:
        return RunConfig(**{**values, **tuples, "policies": tuple(policies) if policies is not None else None})
    except TypeError as err:
        raise DsparkError(f"{where}: {err}") from None


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
    config.use_threads()
    prompts, source, task_tokens = resolve_prompts(config)
    configs, assignment = config.decode_configs(task_tokens), None
    if config.calibration is not None:
        configs, assignment = calibrated_configs(config.calibration, prompts, configs)
    pair = load_pair(config.target, config.draft, config.device, config.dtype, config.heads,
                     drafters={c.drafting.drafter for c in configs})
    check_learned_models(pair, configs)
    if any(c.drafting.drafter == "heads" for c in configs):
        pair.heads  # noqa: B018 — load (and check) the heads before anything runs
    if config.calibration is not None:
        load_calibration(config.calibration).check_models(pair.describe())
    return Planned(config, pair, prompts, configs, source, assignment)


def check_learned_models(pair, configs: list[DecodeConfig]) -> None:
    """A learned signal decodes only with the models it was fitted on, and in float64 (not on MPS)."""
    files = {c.stopping.signal_model for c in configs if c.stopping.metric == LEARNED}
    if files and pair.device.type == "mps":
        raise DsparkError("the learned metric computes in float64, which MPS lacks: use --device cpu, or another metric")
    for path in files:
        fitted = dict(learned_signal.load(path).models)
        for key, mine in zip(("target_fingerprint", "draft_fingerprint"), pair.fingerprints):
            if fitted.get(key) and fitted[key] != mine:
                raise DsparkError(f"the learned signal {path!r} was fitted on other models ({key} {fitted[key]}, "
                                  f"this pair's {mine}): run a replay sweep on these models")


def calibrated_configs(path, prompts: list[Prompt], bases: list[DecodeConfig]) -> tuple[list[DecodeConfig], list[list[int]]]:
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
    if original.get("configs") and [c.to_dict() for c in planned.configs] != [with_defaults(c) for c in original["configs"]]:
        raise DsparkError(f"the policies {where} describes no longer build the same configs; it cannot be re-run")


def execute(config: RunConfig, out: Path, progress=None, say=None, planned: Planned | None = None):
    """Run `config` into a new run folder under `out`: returns (folder, per-config summary table).

    `progress(stage, done, total)` follows the decoding; `say(line)` hears the plan first.
    """

    check_writable(out)  # before models load
    planned = planned or plan_run(config)
    step = stage_steps(progress, "decoding", planned.samples)
    folder, table = run_to_folder(planned.pair, planned.prompts, planned.configs, out, config.settings(), planned.source,
                                  progress=step, assignment=planned.assignment, say=say, run_config=config.to_dict(),
                                  precision=(config.precision, config.precision_budget_s))
    if config.decoder == "hf" and all(c.greedy for c in planned.configs) and config.calibration is None:
        priced_hf(planned, folder, config.settings(), progress, say)  # replay priced on HF's own costs, beside ours
    return folder, table


def rerun_from(run_file: Path, out: Path, progress=None, say=None):
    """`run --config results/<id>/run.json`: the run that file describes, again."""

    check_writable(out)  # before models load
    info = read_json(Path(run_file), "run file")
    config = from_run_info(info, str(run_file))
    planned = plan_run(config)
    check_rerun(planned, info, str(run_file))
    return execute(config, out, progress, say, planned)


def decode_once(text: str, config: DecodeConfig, target: str | None = None, draft: str | None = None,
                device: str = "auto", dtype: str = "auto", chat_template: str = "auto",
                calibration: Path | None = None, domain: str | None = None, heads: str | None = None):
    """`dspark-bench decode`: one speculative generation of `text` (with a calibration: the policy
    of `domain`, or the global one). Returns (pair, the policy used, DecodeResult)."""

    if calibration is not None:
        config = load_calibration(calibration).policy_for(domain or "", strict=domain is not None, base=config)
    pair = load_pair(target, draft, device, dtype, heads, drafters={config.drafting.drafter})
    ids = encode(pair.tokenizer, text, chat_template)
    return pair, config, speculative_decode(pair.target, pair.drafter_for(config), ids, config, pair.eos_ids)
