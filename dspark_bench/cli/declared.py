"""Command-line options made from the declarations (knobs.knob): a knob's option is written
nowhere else.

`with_options(knobs=[...])` adds one option per declared field to a command's own parameters,
through Typer's own API (an `Annotated[..., typer.Option(...)]` parameter in the signature Typer
reads), and hands the command the values given as one dict. A field that `repeats` becomes a
repeatable option where the command takes several values of a knob (a run's grid, a sweep's
space); an option left off is None there ("the default", or "the spec's"), so that a command
can tell what was given. The --help groups follow the declarations: a DecodeConfig part's, or
the workload's own. A command's own options (cli/options.py: --out, --spec, ...) are made the
same way and handed over as the command's own parameters, as Typer parsed them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from pathlib import Path
from typing import Annotated, Optional

import typer

from dspark_bench.config import FIELDS, KNOBS
from dspark_bench.knobs import flag_of

# The --help group of each DecodeConfig part's knobs.
PANELS = {"stopping": "Stopping policy", "drafting": "Drafter", "verification": "Verification", "batching": "Batching"}
TYPES = {"int": int, "float": float, "str": str, "bool": bool}
# A command's default for an option that must be given (Typer's own marker for one).
REQUIRED = ...


def panel_of(f: dataclasses.Field) -> str | None:
    return PANELS[FIELDS[f.name]] if f.name in FIELDS else f.metadata.get("panel")


def help_of(f: dataclasses.Field, many: bool, default_text: str | None) -> str:
    meta = f.metadata
    text = meta["help"]
    if meta.get("choices") and not all(f" {c} " in f" {text} " or f"{c} (" in text for c in meta["choices"]):
        text += f" One of: {' | '.join(meta['choices'])}."  # (rich reads [..] as markup)
    if many and f.name in FIELDS:  # a knob's values: a grid axis (a command's own list says what it is)
        text += " Repeatable: every value is a policy of its own."
    if default_text == "declared":  # left off: the declared default, said here as Typer would
        default_text = "none" if f.default == "" else str(f.default).lower() if f.default is False else str(f.default)
    return text + (f" (default: {default_text})" if default_text else "")


def parameter(f: dataclasses.Field, many: bool, unset: str | None, help: str | None = None,
              default=None) -> inspect.Parameter:
    """One declared field as a Typer option. `many`: repeatable (a list). `unset`: left off it is
    None, which the command reads as `unset` says ("the spec's", or "declared": the declared
    default); else the option's default is `default` (REQUIRED: the option must be given)."""
    kind = Path if f.metadata.get("path") else TYPES[f.type.removesuffix(" | None")]
    flag = flag_of(f)
    # A switch with a flag of its own (--compile) is that flag alone; another, --x/--no-x (Typer's).
    names = () if kind is bool and not f.metadata.get("flag") else (flag,)
    shown = default not in (None, "", REQUIRED)
    option = typer.Option(*names, help=help or help_of(f, many, unset), rich_help_panel=panel_of(f),
                          show_default=shown)
    annotation = Optional[list[kind]] if many else (kind if default is not None else Optional[kind])
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[annotation, option],
                             default=inspect.Parameter.empty if default is REQUIRED else default)


def stored_default(f: dataclasses.Field, many: bool, unset: str | None):
    """An option's default where its value is stored (into a dict): None where the command reads
    that as unset, and for a path (the command takes the declared default: click would read "" as
    the path "."); else the declared one."""
    return None if (many or unset or f.default is None or f.metadata.get("path")) else f.default


def takes_many(f: dataclasses.Field, many) -> bool:
    """Whether a field's option takes several values: `many` True, the fields declared `repeats`;
    a collection of names, those it names."""
    return bool(many and f.metadata.get("repeats")) if isinstance(many, bool) else f.name in many


def as_stored(value):
    """An option's value as the declarations store it: a path as its normalised string."""
    if isinstance(value, list):
        return [as_stored(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def fields_of(cls, names=None, without=()) -> list[dataclasses.Field]:
    """A dataclass's declared fields (those made by knobs.knob), `names` alone if given, none of `without`."""
    declared = [f for f in dataclasses.fields(cls) if "help" in f.metadata and f.name not in without]
    return [f for f in declared if names is None or f.name in names]


def knob_fields(names=None, without=()) -> list[dataclasses.Field]:
    """DecodeConfig's knobs (config.KNOBS), `names` alone if given."""
    return [f for name, f in KNOBS.items() if (names is None or name in names) and name not in without]


def with_options(into: str | None, fields: list[dataclasses.Field], *, many=False, unset: str | None = None,
                 helps: dict | None = None, defaults: dict | None = None):
    """Add `fields` as options to the decorated command; it receives their values as one dict,
    its parameter `into`. `many`: True, fields declared `repeats` take several values; or the
    names of those that do. `helps`: this command's wording of an option's help, where the
    declared one would mislead. `into` None: each value is the command's own parameter of the
    field's name, as Typer parsed it (a path a Path), and left off the declared default or this
    command's (`defaults`; REQUIRED: the option must be given)."""
    if into is None:
        return as_parameters(fields, many, helps or {}, defaults or {})
    assert not defaults, "a stored option's default is its declaration's"

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        generated = [parameter(f, takes_many(f, many), unset, (helps or {}).get(f.name),
                               stored_default(f, takes_many(f, many), unset)) for f in fields]
        own = [p for p in signature.parameters.values() if p.name != into]
        left_off = {f.name: None if (unset or takes_many(f, many)) else f.default for f in fields}

        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            given = {name: as_stored(kwargs.pop(name)) for name in left_off if name in kwargs}
            given = {name: left_off[name] if value is None else value for name, value in given.items()}
            return command(*args, **kwargs, **{into: given})

        wrapper.__signature__ = signature.replace(parameters=own + generated)
        return wrapper

    return decorate


def as_parameters(fields: list[dataclasses.Field], many, helps: dict, defaults: dict):
    """with_options(None, ...): each field made the decorated command's parameter of its name, in
    the place the command lists it (so --help keeps the command's order); the command's body reads
    it as any parameter."""

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        missing = [f.name for f in fields if f.name not in signature.parameters]
        assert not missing, f"{command.__name__} takes no parameter {', '.join(missing)}"
        made = {f.name: parameter(f, takes_many(f, many), None, helps.get(f.name),
                                  defaults.get(f.name, None if takes_many(f, many) else f.default)) for f in fields}
        # The command itself, called as it is: only the signature Typer reads changes.
        command.__signature__ = signature.replace(parameters=[made.get(p.name, p) for p in
                                                              signature.parameters.values()])
        return command

    return decorate

