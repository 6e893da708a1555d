"""Every command's `--help`, found from the app's own command registry: a command added without a
help text or an example fails here, with no list of commands to keep up to date."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from dspark_bench.cli import app

ROOT = typer.main.get_command(app)


def walk(command, path: tuple[str, ...] = ()):
    """(path, command) for the command and everything registered below it, sub-groups included."""
    yield path, command
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):  # a group's commands
        yield from walk(sub, (*path, name))


COMMANDS = [(path, command) for path, command in walk(ROOT) if path]


def test_the_registry_is_walked():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"run", "sweep", "regress", "tasks", "tasks ls", "models", "models build"} <= names


def test_the_app_help_lists_every_command():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    missing = [name for name in ROOT.commands if name not in result.output]
    assert not missing, f"dspark-bench --help does not list {missing}"


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=" ".join)
def test_every_command_has_help_with_an_example(path):
    command = dict(COMMANDS)[path]
    result = CliRunner().invoke(app, [*path, "--help"])
    name = "dspark-bench " + " ".join(path)
    assert result.exit_code == 0, f"{name} --help exited {result.exit_code}:\n{result.output}"
    assert (command.help or "").strip(), f"{name} has no help text"
    assert "Example" in result.output and "dspark-bench " in result.output, \
        f"{name} --help shows no example (an 'Example: dspark-bench ...' line):\n{result.output}"


def options_of(path: tuple[str, ...]) -> dict:
    """A command's options by their field name: name -> the click option."""
    return {p.name: p for p in dict(COMMANDS)[path].params}


def test_knob_options_are_made_from_their_declarations():
    """Every knob (knobs.knob) is an option of `run` and `decode`, with the declared help, default
    and repeatability; none is written by hand (cli/declared.py makes them)."""
    from dspark_bench.config import KNOBS
    from dspark_bench.harness.workload import WORKLOAD_FIELDS, Workload

    run, decode = options_of(("run",)), options_of(("decode",))
    for name, declared in KNOBS.items():
        option = run[name]
        assert declared.metadata["help"] in option.help, name
        repeats = declared.metadata["repeats"] and name not in WORKLOAD_FIELDS
        assert option.multiple == bool(repeats), name
        if name not in ("batch_size", "batch_quorum", "compiled"):  # one generation: one request, not warmed
            left_off = None if declared.metadata["path"] else declared.default  # a path's: the command's (below)
            assert decode[name].default == left_off and not decode[name].multiple, name
    for name in WORKLOAD_FIELDS:  # a workload's settings too, run's defaults the declared ones
        assert run[name].default == next(f.default for f in Workload.__dataclass_fields__.values() if f.name == name)
    sweep = options_of(("sweep",))  # a sweep's flags override its spec: left off, None
    assert sweep["threshold"].multiple and sweep["threshold"].default is None and sweep["limit"].default is None


def test_help_is_grouped_by_what_declares_the_option():
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    panels = ["Options", "Stopping policy", "Drafter", "Verification", "Batching", "Models", "Prompts", "Timing"]
    at = [result.output.index(f"─ {panel} ─") for panel in panels]
    assert at == sorted(at), "the --help groups are in the declared order"
    policy = result.output[at[1]:at[2]]  # a knob sits in its part's group, its choices said once
    assert "--gamma-max" in policy and "--drafter" not in policy
    words = " ".join(word for word in policy.split() if word != "│")
    assert "top1 | entropy | topk_mass | margin | gini | learned" in words
    assert max(len(line) for line in result.output.splitlines()) <= 100


def test_a_path_knob_is_stored_as_its_normalised_string(monkeypatch):
    """--signal-model and --goodput-model read paths: stored as the command line normalises them
    (no trailing slash), and left off, the declared default ("": none), not click's "."."""
    from dspark_bench.harness import run as lib

    seen = []

    def decode_once(text, config, *args, **kwargs):
        seen.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(lib, "decode_once", decode_once)
    CliRunner().invoke(app, ["decode", "hi"])
    CliRunner().invoke(app, ["decode", "hi", "--metric", "learned", "--signal-model", "results/x/"])
    assert [(c.stopping.signal_model, c.stopping.goodput_model) for c in seen] == [("", ""), ("results/x", "")]


def test_a_sweep_switch_given_off_overrides_the_spec():
    from dspark_bench.tuning.spec_files import command_overrides

    assert command_overrides({"ignore_eos": False, "analyze": False}, [])["ignore_eos"] is False
    assert "ignore_eos" not in command_overrides({"ignore_eos": None, "analyze": False}, [])
    assert "analyze" not in command_overrides({"ignore_eos": None, "analyze": False}, [])  # --analyze left off


def test_a_commands_own_options_are_declared_once():
    """--out, --spec, --decoder, ... are declared once (cli/options.py), each used by some command
    with the declared flag; options written by hand in cli/ stay a few one-offs."""
    from pathlib import Path

    from dspark_bench.cli.options import DECLARED

    used = {name: [path for path, command in COMMANDS for p in command.params if p.name == name] for name in DECLARED}
    assert not [name for name, paths in used.items() if not paths], "a declared option no command takes"
    for name, f in DECLARED.items():
        flag = f.metadata["flag"] or "--" + name.replace("_", "-")
        assert all(flag in options_of(path)[name].opts for path in used[name]), name
    cli = Path(__file__).resolve().parents[1] / "dspark_bench" / "cli"
    assert sum(path.read_text().count("typer.Option(") for path in cli.glob("*.py")) <= 15
    assert [p.name for p in options_of(("continuations", "write")).values() if "--decoder" in p.opts] == ["decoder"]
