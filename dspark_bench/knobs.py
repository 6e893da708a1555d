"""A knob declared once: its default, its help, the values it may take and what it needs to have
any effect, on the dataclass field that holds it (config.py's parts, the workload, a sweep spec,
the commands' shared options). The CLI's options (cli/declared.py), the checks (`check_declared`)
and the search spaces all read these declarations.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

from dspark_bench.errors import DsparkError


def knob(default, help: str, *, choices: tuple = (), at_least=None, above=None, at_most=None, below=None,
         searched: bool = False, policy: bool = True, repeats: bool = False, flag: str | None = None,
         noun: str | None = None, panel: str | None = None, path: bool = False, check=None, needs=None):
    """A knob declared once: its default, its help (the CLI option's), the values it may take
    (`choices`, or bounds: `at_least` or `above` below, `at_most` or `below` above; or `check`, a function of
    its part refusing a value of a syntax of its own; all checked in one place, check_declared), whether a
    sweep may search it, whether it belongs to a policy (a calibration file stores those), and whether `run`
    takes several values of it (a grid axis). cli/declared.py makes every command's option from this; `flag`
    names an option whose name is not the field's, `panel` the --help group of a setting outside DecodeConfig
    (whose parts name their own); `path`: the option reads a path, a string as the command line normalises it;
    `needs`: what it needs to have any effect (Needs; a knob given without it is refused, Workload.check_needs)."""
    # A registry (a dict, e.g. schedules.SCHEDULES) stays live: a schedule added to it is a choice.
    meta = {"help": help, "choices": choices if isinstance(choices, dict) else tuple(choices), "at_least": at_least,
            "above": above, "at_most": at_most, "below": below, "searched": searched, "policy": policy,
            "repeats": repeats, "flag": flag, "noun": noun, "panel": panel, "path": path, "check": check,
            "needs": needs}
    return field(default=default, metadata=meta)


def flag_of(f) -> str:
    """The option a declared field is typed as: its own `flag`, else --its-name."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def check_needs(declared: dict, given: dict, workload, policies: list) -> None:
    """Refuse, before any work, a knob given where it has no effect (its declaration's `needs`):
    `given` (knob -> the values typed) names a knob `declared` (knob -> its field) holds with a value
    other than its default, and it needs what none of `policies` (DecodeConfigs of `workload`) gives."""
    for name, values in given.items():
        f = declared[name]
        needs = f.metadata.get("needs")  # (only a knob with needs is compared: its values are plain)
        if needs is not None and set(values) != {f.default} and not any(needs.holds(workload, p) for p in policies):
            raise DsparkError(f"{flag_of(f)} has no effect here: it needs {needs.what}")


@dataclass(frozen=True)
class Needs:
    """What a knob needs to do anything: `holds(workload, policy)`, for a workload (a run or a
    sweep) and one of its policies (a DecodeConfig); `what` says it in the refusal."""

    what: str
    holds: Callable


def within(value, meta) -> bool:
    """Whether a number lies within a declaration's bounds (none: any)."""
    low, above, high, below = meta.get("at_least"), meta.get("above"), meta.get("at_most"), meta.get("below")
    return ((low is None or value >= low) and (above is None or value > above) and (high is None or value <= high)
            and (below is None or value < below))


def bounds(meta) -> str:
    """A declaration's bounds as its error says them: "at least 1", "in (0, 1]", "in [0, 1)"."""
    low, above = meta.get("at_least"), meta.get("above")
    high, closed = (meta.get("at_most"), "]") if meta.get("below") is None else (meta.get("below"), ")")
    if high is None:
        return f"at least {low:g}" if low is not None else f"above {above:g}"
    if low is None and above is None:
        return f"at most {high:g}" if closed == "]" else f"below {high:g}"
    return f"in [{low:g}, {high:g}{closed}" if low is not None else f"in ({above:g}, {high:g}{closed}"


def check_declared(part) -> None:
    """Each field holds its declared type (a YAML spec or --set can hand any value over), one of
    its choices, a number within its bounds, and what its own `check` accepts."""
    for f in dataclasses.fields(part):
        value, kind = getattr(part, f.name), f.type.removesuffix(" | None")
        if value is None and kind != f.type:
            continue
        if kind == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            raise DsparkError(f"{f.name} must be an integer (got {value!r})")
        if kind == "float" and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                or not math.isfinite(value)):
            raise DsparkError(f"{f.name} must be a finite number (got {value!r})")
        if kind == "bool" and not isinstance(value, bool):
            raise DsparkError(f"{f.name} must be true or false (got {value!r})")
        if kind == "str" and not isinstance(value, str):
            raise DsparkError(f"{f.name} must be a {'path' if f.name.endswith('_model') else 'name'} (got {value!r})")
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            noun = f.metadata.get("noun") or f.name.replace("_", " ")
            raise DsparkError(f"unknown {noun} {value!r}; choose one of {', '.join(choices)}")
        if kind in ("int", "float") and not within(value, f.metadata):
            flag = f" ({f.metadata['flag']})" if f.metadata.get("flag") else ""  # the name a user typed too
            raise DsparkError(f"{f.name}{flag} must be {bounds(f.metadata)} (got {value:g})")
        if f.metadata.get("check"):  # after the fields declared before it: it may read them
            f.metadata["check"](part)
