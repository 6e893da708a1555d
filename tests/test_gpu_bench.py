"""benchmarks/gpu.sh --device cpu --smoke: the GPU benchmark's whole code path, on CI's CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_benchmark_smoke_run(tmp_path):
    env_python = Path(sys.executable).parent
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--device", "cpu", "--smoke", "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=900,
                            env={"PATH": f"{env_python}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("| shipped pair |")]
    decoders = {line.split(" | ")[2] for line in table}
    assert decoders == {"ours", "HF assisted generation", "autoregressive: ours", "autoregressive: model.generate",
                        "draft loop, host sync per step", "draft loop, decisions on the device",
                        "draft loop, host sync per step, compiled", "draft loop, decisions on the device, compiled"}
    policies = [line.split(" | ")[3] for line in table if line.split(" | ")[2] == "ours"]
    assert sum("verify-side" in p for p in policies) == 4 and sum("compiled" in p for p in policies) == 4
    assert any("B=2" in p for p in policies)
    results = json.loads((tmp_path / "results.json").read_text())
    rows = results["shipped pair"]["rows"]
    assert all(r["identical"] == 1.0 for r in rows if "identical" in r)  # greedy fp32: token for token
    samples = pd.read_parquet(Path(results["shipped pair"]["run_folder"]) / "samples.parquet")
    assert set(samples["draft_mode"]) == {"early-stop", "verify-side"} and samples["compiled"].any()
    assert samples["identical_share"].eq(1.0).all()
