"""An installed package is the whole tool: a wheel built from this checkout, installed alone in a fresh
virtual environment and used from a folder that is not the checkout, finds the task's own sweep spec
(sweeps/code.yaml, shipped as dspark_bench/sweeps), the shipped weights and the tasks."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What a wheel is built from (setup.py maps sweeps/ into the package); copied so that the build's
# build/ and egg-info folders never land in the checkout.
BUILT_FROM = ("pyproject.toml", "setup.py", "README.md", "dspark_bench", "sweeps")

# Run by the installed package's interpreter: what `sweep --task code` would search (the command's
# own resolve_spec), the shipped pair loaded, and a task's prompts.
INSTALLED = """
import json
import dspark_bench
from dspark_bench.harness.models import load_pair
from dspark_bench.tasks import load_task
from dspark_bench.tuning.spec_files import resolve_spec

spec, origin = resolve_spec(None, {"task": "code"})
pair = load_pair(None, None, device="cpu")
print(json.dumps({"package": dspark_bench.__file__, "origin": origin, "gamma_max": spec.space["gamma_max"],
                  "target_layers": pair.target.config.num_hidden_layers, "prompts": len(load_task("code", 2))}))
"""


def fresh_environment(folder: Path) -> Path:
    """A virtual environment that sees this one's dependencies, but not its editable checkout: a .pth
    file lists this environment's site-packages, whose own .pth files (the editable finder among
    them) Python does not read from a folder a .pth file adds."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def test_a_wheel_installed_alone_searches_the_tasks_own_spec_with_its_weights_and_tasks(tmp_path):
    source, wheels, elsewhere = tmp_path / "source", tmp_path / "wheels", tmp_path / "elsewhere"
    source.mkdir()
    for name in BUILT_FROM:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of the checkout on the path
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(source)], check=True, env=env, capture_output=True)
    (wheel,) = wheels.glob("dspark_bench-*.whl")
    python = fresh_environment(tmp_path / "venv")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, env=env,
                   capture_output=True)
    elsewhere.mkdir()
    done = subprocess.run([str(python), "-c", INSTALLED], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    package = Path(found["package"]).parent
    assert package.is_relative_to(tmp_path / "venv") and not package.is_relative_to(ROOT)  # the wheel's, not ours
    shipped = package / "sweeps" / "code.yaml"
    assert found["origin"].startswith(f"search space: {shipped}, the task's own spec")
    assert found["gamma_max"] == [2, 3, 4, 5, 6, 8]  # sweeps/code.yaml's, not the dense default's 1-8
    assert shipped.read_text() == (ROOT / "sweeps" / "code.yaml").read_text()
    assert {p.name for p in (package / "sweeps").glob("*.yaml")} == {p.name for p in (ROOT / "sweeps").glob("*.yaml")}
    assert found["target_layers"] > 0 and found["prompts"] == 2
