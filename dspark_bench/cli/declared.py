"""Command-line options made from the declarations (config.knob): a knob's option is written
nowhere else.

`with_options(knobs=[...])` adds one option per declared field to a command's own parameters,
through Typer's own API (an `Annotated[..., typer.Option(...)]` parameter in the signature Typer
reads), and hands the command the values given as one dict. A field that `repeats` becomes a
repeatable option where the command takes several values of a knob (a run's grid, a sweep's
space); an option left off is None there ("the default", or "the spec's"), so that a command
can tell what was given. The --help groups follow the declarations: a DecodeConfig part's, or
the workload's own.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_bench.config import FIELDS, KNOBS

# The --help group of each DecodeConfig part's knobs.
PANELS = {"stopping": "Stopping policy", "drafting": "Drafter", "verification": "Verification", "batching": "Batching"}
TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def panel_of(f: dataclasses.Field) -> str | None:
    return PANELS[FIELDS[f.name]] if f.name in FIELDS else f.metadata.get("panel")


def help_of(f: dataclasses.Field, many: bool, default_text: str | None) -> str:
    meta = f.metadata
    text = meta["help"]
    if meta.get("choices") and not all(f" {c} " in f" {text} " or f"{c} (" in text for c in meta["choices"]):
        text += f" One of: {' | '.join(meta['choices'])}."  # (rich reads [..] as markup)
    if many:
        text += " Repeatable: every value is a policy of its own."
    if default_text == "declared":  # left off: the declared default, said here as Typer would
        default_text = "none" if f.default == "" else str(f.default).lower() if f.default is False else str(f.default)
    return text + (f" (default: {default_text})" if default_text else "")


def parameter(f: dataclasses.Field, many: bool, unset: str | None, help: str | None = None) -> inspect.Parameter:
    """One declared field as a Typer option. `many`: repeatable (a list). `unset`: left off it is
    None, which the command reads as `unset` says ("the spec's", or "declared": the declared
    default); else the option's default is the declared one."""
    kind = Path if f.metadata.get("path") else TYPES[f.type.removesuffix(" | None")]
    flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
    # Left off: None where the command reads that as unset, and for a path (the command takes the
    # declared default: click would read "" as the path ".").
    default = None if (many or unset or f.default is None or f.metadata.get("path")) else f.default
    # A switch with a flag of its own (--compile) is that flag alone; another, --x/--no-x (Typer's).
    names = () if kind is bool and not f.metadata.get("flag") else (flag,)
    option = typer.Option(*names, help=help or help_of(f, many, unset), rich_help_panel=panel_of(f),
                          show_default=default is not None and default != "")
    annotation = Optional[list[kind]] if many else (kind if default is not None else Optional[kind])
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, option])


def as_stored(value):
    """An option's value as the declarations store it: a path as its normalised string."""
    if isinstance(value, list):
        return [as_stored(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def fields_of(cls, names=None, without=()) -> list[dataclasses.Field]:
    """A dataclass's declared fields (those made by config.knob), `names` alone if given, none of `without`."""
    declared = [f for f in dataclasses.fields(cls) if "help" in f.metadata and f.name not in without]
    return [f for f in declared if names is None or f.name in names]


def knob_fields(names=None, without=()) -> list[dataclasses.Field]:
    """DecodeConfig's knobs (config.KNOBS), `names` alone if given."""
    return [f for name, f in KNOBS.items() if (names is None or name in names) and name not in without]


def with_options(into: str, fields: list[dataclasses.Field], *, many: bool = False, unset: str | None = None,
                 helps: dict | None = None):
    """Add `fields` as options to the decorated command; it receives their values as one dict,
    its parameter `into`. `many`: fields declared `repeats` take several values. `helps`: this
    command's wording of an option's help, where the declared one would mislead."""

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        generated = [parameter(f, many and f.metadata.get("repeats"), unset, (helps or {}).get(f.name)) for f in fields]
        own = [p for p in signature.parameters.values() if p.name != into]
        left_off = {f.name: None if (unset or (many and f.metadata.get("repeats"))) else f.default for f in fields}

        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            given = {name: as_stored(kwargs.pop(name)) for name in left_off if name in kwargs}
            given = {name: left_off[name] if value is None else value for name, value in given.items()}
            return command(*args, **kwargs, **{into: given})

        wrapper.__signature__ = signature.replace(parameters=own + generated)
        return wrapper

    return decorate
