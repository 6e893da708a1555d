"""Which spec a `sweep` command means: the task's own file (sweeps/T.yaml: the working folder's, an
installed package's or the checkout's), a user's file, the command's flags (`--set` too) on top, or
the dense default; and a knob the command typed where none of the sweep's points would read it,
refused. The spec itself, its fields and checks: tuning/spec.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from dspark_bench.config import KNOBS, SEARCHABLE_FIELDS
from dspark_bench.errors import DsparkError, first_line
from dspark_bench.knobs import check_needs
from dspark_bench.tuning.spec import (
    DEFAULT_SPACE,
    DENSE_SPACE,
    SweepSpec,
    base_config,
    evaluation_for,
    parse_spec,
    per_temperature,
    points,
)

# Where `sweep --task T` looks for the task's own spec, sweeps/T.yaml: the working folder, then the
# specs an installed package ships (the checkout's sweeps/, packaged as dspark_bench/sweeps: setup.py),
# then the checkout's own sweeps/ (a package run from its checkout has no dspark_bench/sweeps).
SPEC_FOLDERS = (Path("sweeps"), Path(__file__).resolve().parents[1] / "sweeps",
                Path(__file__).resolve().parents[2] / "sweeps")



def command_overrides(flags: dict, set_items: list[str]) -> dict:
    """Spec overrides from the sweep command: each flag given, the repeatable policy flags as the
    search space's lists, and every `--set key=value` (a YAML value) last."""
    flags = dict(flags)
    flags["analyze"] = flags.get("analyze") or None  # --analyze left off keeps the spec's
    space = {name: flags.pop(name, None) for name in SEARCHABLE_FIELDS}
    overrides = flag_overrides(flags, space)
    if flags.get("task") or flags.get("dataset"):  # a prompt source given replaces the spec's
        overrides.update(task=flags.get("task"), dataset=flags.get("dataset"))
    for item in set_items:
        key, sep, value = item.partition("=")
        if not sep:
            raise DsparkError(f"--set takes key=value (got {item!r})")
        try:
            overrides[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise DsparkError(f"--set {key.strip()}: not a valid YAML value ({first_line(err)})") from None
    return overrides


def flag_overrides(fields: dict, space: dict) -> dict:
    """Spec overrides from command-line flags: each field given (not None), and each search-space
    list given (not empty) as `space.<name>`."""
    overrides = {key: value for key, value in fields.items() if value is not None}
    overrides.update({f"space.{name}": list(values) for name, values in space.items() if values})
    return overrides


def task_spec(task: str | None) -> Path | None:
    """The task's own spec (sweeps/<task>.yaml), if there is one."""
    if not task:
        return None
    return next((folder / f"{task}.yaml" for folder in SPEC_FOLDERS if (folder / f"{task}.yaml").is_file()), None)


ADDED_DIMENSIONS = ("space.batch_size", "space.drafter", "space.ngram_min", "space.ngram_max")


def resolve_spec(path: Path | None, overrides: dict) -> tuple[SweepSpec, str]:
    """The spec a `sweep` command means, and one line saying where its search space came from.

    Without --spec: the task's own sweeps/<task>.yaml where it exists; else, when no search-space
    flag is given, the dense default under replay (thousands of policies for about the price of
    one decoding pass, greedy or sampled) or a small grid under real timed runs, said as such.
    """
    # A batch size or a drafter (with its n-gram knobs) adds a dimension to whichever space is
    # chosen; the policy's knobs choose one.
    chosen_by_flags = any(key == "space" or (key.startswith("space.") and key not in ADDED_DIMENSIONS)
                          for key in overrides)
    if path is None and not chosen_by_flags:
        path = task_spec(overrides.get("task"))
        if path is not None:
            spec = load_spec(path, overrides)
            return spec, f"search space: {path}, the task's own spec ({len(points(spec)):,} points)"
    if path is not None or chosen_by_flags:
        spec = load_spec(path, overrides)
        n = len(points(spec))
        return spec, f"search space: {path or 'the command-line flags'} ({n:,} point{'s' * (n != 1)})"
    # The dense space, then any batch-size dimension the flags add to it.
    dims = {key: value for key, value in overrides.items() if key.startswith("space.")}
    spec = load_spec(None, {**{k: v for k, v in overrides.items() if k not in dims}, "space": DENSE_SPACE, **dims})
    if evaluation_for(spec) == "replay":
        return spec, f"search space: the dense default ({len(points(spec)):,} points plus every fixed gamma)"
    spec = load_spec(None, overrides)
    return spec, (f"search space: a small default grid ({len(points(spec))} points) — real evaluation needs a "
                  "timed run per policy, so replay's dense default is not used; give --spec or "
                  "--threshold/--gamma-max/... for more")


def load_spec(path: Path | None, overrides: dict) -> SweepSpec:
    """A spec file (or the defaults) with command-line overrides applied on top."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise DsparkError(f"sweep spec {str(path)!r} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise DsparkError(f"{path}: not valid YAML ({first_line(err)})") from None
        if not isinstance(data, dict):
            raise DsparkError(f"{path}: a sweep spec must be a mapping")
    for key, value in overrides.items():  # in order: a later override wins
        if key.startswith("space."):
            data.setdefault("space", dict(DEFAULT_SPACE))[key.removeprefix("space.")] = value
        else:  # (a copy: a space given whole, such as DENSE_SPACE, is never changed in place)
            data[key] = dict(value) if key == "space" and isinstance(value, dict) else value
    # Who said what a check refuses: the file, or the file as the flags changed it.
    where = "sweep" if path is None else f"{path} with the command's flags" if overrides else str(path)
    spec = parse_spec(data, where)
    check_typed_needs(spec, overrides, where)
    return spec


def check_typed_needs(spec: SweepSpec, overrides: dict, where: str) -> None:
    """A knob the command typed (a flag, `--set`) where none of the sweep's points, at any of its
    temperatures, would read it is refused (knobs.check_needs). A spec file's own values are the
    file's: a task's spec sets knobs for its own space, which the command's flags may change."""
    declared = {**KNOBS, **{f.name: f for f in dataclasses.fields(SweepSpec)}}
    given = {key.removeprefix("space."): value if key.startswith("space.") else [value]
             for key, value in overrides.items() if key != "space" and key.removeprefix("space.") in declared}
    policies = [p for one in per_temperature(spec) for p in points(one, base_config(one, None))]
    try:
        check_needs(declared, given, spec, policies)
    except DsparkError as err:
        raise DsparkError(f"{where}: {err}") from None
