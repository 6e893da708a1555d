"""notebooks/analysis.ipynb runs top to bottom on a tiny run folder."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from typer.testing import CliRunner

from dspark_bench.cli import app

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "analysis.ipynb"


@pytest.fixture(scope="module")
def run_folder(saved_pair, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("notebook")
    prompts = root / "prompts.jsonl"
    rows = [{"prompt": "def add(a, b):", "category": "code"}, {"prompt": "The quick brown fox", "category": "prose"}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    target, draft = saved_pair
    out = root / "results"
    result = CliRunner().invoke(app, ["run", "--target", target, "--draft", draft, "--dataset", str(prompts),
                                      "--schedule", "threshold", "--schedule", "fixed", "--threshold", "0.2",
                                      "--threshold", "0.5", "--gamma-max", "3", "--max-new-tokens", "12",
                                      "--repeats", "1", "--trace", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (folder,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    return folder


def test_notebook_runs_top_to_bottom(run_folder, monkeypatch, tmp_path):
    # A second run to compare with: a copy under another run id.
    twin = tmp_path / f"{run_folder.name}-twin"
    shutil.copytree(run_folder, twin)
    info = json.loads((twin / "run.json").read_text())
    (twin / "run.json").write_text(json.dumps({**info, "run_id": twin.name}))
    monkeypatch.setenv("DSPARK_RUNS", f"{run_folder}:{twin}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=240,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    # curves, heatmap, category bars, positions, run comparison, calibration, stops, trace
    assert len(images) >= 8
    if os.environ.get("DSPARK_KEEP_NOTEBOOK"):
        nbformat.write(nb, os.environ["DSPARK_KEEP_NOTEBOOK"])
    first = nb.cells[1]
    assert "DSPARK_RUNS" in first.source and str(run_folder) in first.outputs[0]["data"]["text/plain"]
