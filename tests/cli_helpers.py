"""Helpers of the tests that drive the `dspark-bench` command line."""

from __future__ import annotations

import hashlib
from pathlib import Path

from typer.testing import CliRunner

from dspark_bench.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def folder_digest(folder: Path) -> dict[str, str]:
    """Each file's hash: a folder left untouched digests the same."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def one_error_line(result) -> str:
    """The one line a failed command printed (no traceback)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]
