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
