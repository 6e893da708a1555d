"""A run's whole configuration: what `run` decodes, with what, and how it is timed.

One frozen dataclass, commented field by field. `run` builds it from flags, writes it whole into
run.json, and `dspark-bench run --config results/<id>/run.json` runs it again; `regress` re-runs
a baseline through the same path. A run folder made before run.json kept its config is read
back from the parts it did keep (configs, settings, models, prompts).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path

from dspark_bench.config import DEFAULT_MAX_NEW_TOKENS, DecodeConfig, from_dict, with_defaults
from dspark_bench.decoding.engine import speculative_decode
from dspark_bench.decoding.goodput import rule_for
from dspark_bench.decoding.schedule import expressible
from dspark_bench.errors import DsparkError
from dspark_bench.harness.calibration_file import load_calibration
from dspark_bench.harness.models import load_pair
from dspark_bench.harness.runner import RunnerSettings, planned_samples, run_to_folder, stage_steps
from dspark_bench.prompts import Prompt, encode, prompts_fingerprint
from dspark_bench.results import check_writable, read_json
from dspark_bench.tasks import load_prompts


@dataclass(frozen=True)
class RunConfig:
    # --- models
    target: str | None = None  # Hugging Face name or local folder; None: the shipped reference pair
    draft: str | None = None  # a draft sharing the target's vocabulary
    device: str = "auto"  # auto | cpu | cuda | mps
    dtype: str = "auto"  # auto (fp32 on CPU, bf16 on CUDA) | float32 | bfloat16 | float16
    # --- prompts: exactly one of task and dataset
    task: str | None = None  # a built-in task (tasks ls)
    dataset: str | None = None  # a prompts file (JSONL, JSON, CSV, Parquet, text) or a hub id
    split: str = "train"  # the dataset's split (hub datasets)
    prompt_field: str | None = None  # column holding the prompt (None: guessed)
    category_field: str | None = None  # column holding the category (None: guessed)
    limit: int | None = None  # the first N prompts only
    turns: str = "first"  # multi-turn prompts: "first" turn, or "all" on the model's own answers
    chat_template: str = "auto"  # auto: the tokenizer's chat template where it has one | none
    # --- the policy grid: every combination of these lists runs ...
    metric: tuple[str, ...] = ("top1",)
    schedule: tuple[str, ...] = ("threshold",)
    threshold: tuple[float, ...] = (0.5,)
    gamma_max: tuple[int, ...] = (5,)
    min_draft_len: tuple[int, ...] = (1,)
    semantics: tuple[str, ...] = ("dspark",)  # whose rule: ours, HF's (keeps the failing token), llama.cpp's
    goodput_model: str = ""  # the goodput schedule's model: a replay sweep's folder or its goodput_model.json
    threshold_start: float = 0.3  # ramp schedule: threshold at draft position 1 ...
    threshold_end: float = 0.8  # ... rising to this at gamma_max
    topk: int = 5  # k of the topk_mass metric
    # ... unless `policies` lists whole DecodeConfig dicts (a re-run of a run whose policies
    # were not a grid: a calibration's, a benchmark's chosen few)
    policies: tuple[dict, ...] | None = None
    calibration: str | None = None  # a calibration file: each prompt gets its domain's policy
    # --- verification
    temperature: float = 0.0  # 0: greedy; > 0: lossless rejection sampling
    top_p: float = 1.0  # nucleus filter, target and draft alike
    max_new_tokens: int | None = None  # None: the task's own, else DEFAULT_MAX_NEW_TOKENS
    seed: int = 0  # seeds each decode's sampling generator
    # --- concurrency: every policy runs at each batch size (requests decoded together, B > 1
    # through the batched engine, padded layout); rows that finish are replaced from the waiting
    # prompts ("refill", continuous batching) or the batch empties before the next starts ("drain")
    batch_sizes: tuple[int, ...] = (1,)
    batching: str = "refill"
    # --- the speculative side: our engine, or HF assisted generation (`generate(assistant_model=…)`)
    # running each policy under HF's own rule, timed against the same baseline
    engine: str = "ours"
    # --- the decoders' execution: where the rule cuts drafts ("early-stop" and/or "verify-side",
    # each a policy of its own here), and compiled steps with a static cache (batch size 1)
    draft_mode: tuple[str, ...] = ("early-stop",)
    compiled: bool = False
    # --- what drafts (drafters.py): the draft model, the target's heads, prompt lookup; each a
    # policy of its own here. Lookup matches n-grams of ngram_max down to ngram_min tokens.
    drafter: tuple[str, ...] = ("model",)
    ngram_min: int = 1
    ngram_max: int = 3
    heads: str | None = None  # the heads drafter's heads (default: the shipped target's)
    # --- runner
    repeats: int = 1  # timed baseline/speculative pairs per prompt and policy (medians kept)
    warmup: int = 1  # untimed decodes of each kind before timing starts
    trace: bool = False  # also write rounds.parquet
    ignore_eos: bool = False  # timing only: every sequence exactly max_new_tokens long

    def __post_init__(self) -> None:
        check(self)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def decode_configs(self, task_tokens: int | None = None) -> list[DecodeConfig]:
        """The policies this run decodes: its explicit list, or every combination of the grid."""
        tokens = self.max_new_tokens if self.max_new_tokens is not None else (task_tokens or DEFAULT_MAX_NEW_TOKENS)
        if self.policies is not None:
            def sizes(policy: dict):  # a policy naming no batch size runs at each of the run's
                return [policy["batch_size"]] if "batch_size" in policy else self.batch_sizes

            return [from_dict({**policy, "batch_size": b, "max_new_tokens": policy.get("max_new_tokens", tokens),
                               **({"compiled": True} if self.compiled else {})})
                    for policy in self.policies for b in sizes(policy)]
        grid = itertools.product(self.batch_sizes, self.metric, self.schedule, self.threshold, self.gamma_max,
                                 self.min_draft_len, self.semantics, self.draft_mode, self.drafter)
        # goodput has no threshold and keeps its last token under our rule and HF's alike: one policy each.
        configs = [DecodeConfig(metric=m, schedule=s, threshold=self.threshold[0] if s == "goodput" else t,
                                gamma_max=g, min_draft_len=n, semantics="dspark" if s == "goodput" and e == "hf" else e,
                                threshold_start=self.threshold_start,
                                threshold_end=self.threshold_end, topk=self.topk, temperature=self.temperature,
                                top_p=self.top_p, max_new_tokens=tokens, seed=self.seed, batch_size=b,
                                goodput_model=self.goodput_model if s == "goodput" else "", draft_mode=d,
                                compiled=self.compiled, drafter=r,
                                ngram_min=self.ngram_min if r == "lookup" else 1,
                                ngram_max=self.ngram_max if r == "lookup" else 3)
                   for b, m, s, t, g, n, e, d, r in grid]
        return list(dict.fromkeys(configs))

    def settings(self):
        return RunnerSettings(repeats=self.repeats, warmup=self.warmup, trace=self.trace,
                              chat_template=self.chat_template, turns=self.turns, ignore_eos=self.ignore_eos,
                              batching=self.batching, engine=self.engine)


def check(config: RunConfig) -> None:
    """Refuse a config that cannot run, before anything loads."""
    sources = [name for name in ("task", "dataset") if getattr(config, name)]
    if len(sources) != 1:
        raise DsparkError("pass exactly one of --task, --dataset or --prompts"
                          + (f" (got {' and '.join('--' + s for s in sources)})" if sources else ""))
    if config.turns not in ("first", "all"):
        raise DsparkError(f"--turns must be first or all (got {config.turns!r})")
    if config.repeats < 1:
        raise DsparkError(f"--repeats must be at least 1 (got {config.repeats})")
    if not config.batch_sizes or any(not isinstance(b, int) or b < 1 for b in config.batch_sizes):
        raise DsparkError(f"--batch-size must be a whole number of at least 1 (got {list(config.batch_sizes)})")
    if config.batching not in ("refill", "drain"):
        raise DsparkError(f"--batching must be refill or drain (got {config.batching!r})")
    if max(config.batch_sizes) > 1 and config.turns == "all":
        raise DsparkError("--turns all decodes each turn on the previous answer, one prompt at a time; "
                          "use --batch-size 1 with it")
    if config.engine not in ("ours", "hf"):
        raise DsparkError(f"--engine must be ours or hf (got {config.engine!r})")
    if config.engine == "hf" and config.ignore_eos:
        raise DsparkError("--engine hf cannot ignore EOS (HF generate falls back to the model's own EOS); drop --ignore-eos")
    if config.engine == "hf" and max(config.batch_sizes) > 1:
        raise DsparkError("--engine hf decodes one request at a time (HF assisted generation has no batching); "
                          "use --batch-size 1")
    if max(config.batch_sizes) > 1 and (config.compiled or "verify-side" in config.draft_mode):
        raise DsparkError("--compile and --draft-mode verify-side run at batch size 1 only; use --batch-size 1")
    if config.calibration is not None and config.policies is not None:
        raise DsparkError("a calibration chooses the policies; a run cannot also list them")
    if config.policies is not None and not config.policies:
        raise DsparkError("the run lists no policy to decode")
    configs = config.decode_configs()  # every policy of the grid is valid (one clear line if not)
    if config.engine == "hf" and any(c.compiled or c.draft_mode != "early-stop" for c in configs):
        raise DsparkError("--engine hf runs HF's own generate loop: drop --compile and --draft-mode")
    if config.engine == "hf" and any(c.drafter != "model" for c in configs):
        raise DsparkError("--engine hf runs HF's assisted generation with the draft model: drop --drafter")
    if config.engine == "hf":
        for c in configs:
            if expressible(c, "hf"):
                raise DsparkError(f"--engine hf runs HF's own rule, which cannot express {c.label()} (it needs "
                                  f"{'; '.join(expressible(c, 'hf'))}); use --metric top1 --min-draft-len 0 "
                                  "--semantics hf, or --schedule fixed")
    if any(c.schedule == "goodput" for c in configs):
        for c in configs:  # the model exists, reads, and has the metric: before any model loads
            if c.schedule == "goodput":
                rule_for(c)


def from_config_dict(values: dict, where: str = "run config") -> RunConfig:
    """A RunConfig from a mapping (run.json's "config"), refusing keys it does not know."""
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
    runner = {key: value for key, value in settings.items() if key in known}
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

    prompts, source, task_tokens = resolve_prompts(config)
    configs, assignment = config.decode_configs(task_tokens), None
    if config.calibration is not None:
        configs, assignment = calibrated_configs(config.calibration, prompts, configs)
    pair = load_pair(config.target, config.draft, config.device, config.dtype, config.heads)
    if any(c.drafter == "heads" for c in configs):
        pair.heads  # noqa: B018 — load (and check) the heads before anything runs
    if config.calibration is not None:
        load_calibration(config.calibration).check_models(pair.describe())
    return Planned(config, pair, prompts, configs, source, assignment)


def calibrated_configs(path, prompts: list[Prompt], bases: list[DecodeConfig]) -> tuple[list[DecodeConfig], list[list[int]]]:
    """The distinct calibrated policies, and for each prompt the indexes of its own: one per
    base (one base per batch size, each taking the calibration made nearest its batch size)."""

    calibration = load_calibration(path)
    configs: list[DecodeConfig] = []
    assignment: list[list[int]] = [[] for _ in prompts]
    for base in bases:
        per_prompt = calibration.for_batch_size(base.batch_size).configs_for(prompts, base=base)
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
    return run_to_folder(planned.pair, planned.prompts, planned.configs, out, config.settings(), planned.source,
                         progress=step, assignment=planned.assignment, say=say, run_config=config.to_dict())


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
    pair = load_pair(target, draft, device, dtype, heads)
    ids = encode(pair.tokenizer, text, chat_template)
    return pair, config, speculative_decode(pair.target, pair.drafter_for(config), ids, config, pair.eos_ids)
