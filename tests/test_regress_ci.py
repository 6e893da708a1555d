"""The CI jobs docs/regress.md gives (the repository's GitHub Actions workflow and the GitLab CI
block) run `regress` with flags it has, on a baseline the repository holds."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer
import yaml

from dspark_bench.cli import app

ROOT = Path(__file__).resolve().parent.parent


def regress_flags() -> set[str]:
    command = typer.main.get_command(app).commands["regress"]
    return {opt for param in command.params for opt in getattr(param, "opts", [])}


def commands_of(steps: list[str]) -> list[list[str]]:
    return [shlex.split(line) for step in steps for line in step.splitlines()
            if line.strip().startswith("dspark-bench")]


def check(command: list[str]) -> None:
    assert command[:2] == ["dspark-bench", "regress"], command
    given = [word.split("=")[0] for word in command[2:] if word.startswith("--")]
    assert set(given) <= regress_flags(), set(given) - regress_flags()
    baseline = command[command.index("--baseline") + 1]
    assert (ROOT / baseline).is_file() and "--report" in command


def test_the_github_workflow_runs_regress_and_publishes_its_table():
    workflow = yaml.safe_load((ROOT / ".github/workflows/benchmark.yml").read_text())
    assert "pull_request" in workflow[True]  # YAML reads the key `on` as true
    steps = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    (command,) = commands_of(steps)
    check(command)
    assert any("regress.md" in step and "GITHUB_STEP_SUMMARY" in step for step in steps)


def test_the_gitlab_job_in_the_docs_runs_the_same_command():
    text = (ROOT / "docs/regress.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "regress:" in b]
    job = yaml.safe_load(block)["regress"]
    (command,) = commands_of(job["script"])
    check(command)
    assert "merge_request_event" in str(job["rules"]) and "regress.md" in job["artifacts"]["paths"]
