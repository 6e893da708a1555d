"""The package's shape holds: layers import only downwards, no import circle, imports inside
functions say why, and the top of the package stays a handful of core modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dspark_bench"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
RUFF = Path(sys.executable).with_name("ruff")


def test_layer_contracts_are_kept():
    """pyproject.toml's import-linter contracts; a broken one names the offending import."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: install the test extras (import-linter)")
    done = subprocess.run([str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def import_cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), every import counted,
    those inside functions included."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_circle_anywhere():
    assert import_cycles(grimp.build_graph("dspark_bench")) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "__init__.py").write_text("")
    (tmp_path / "loop" / "a.py").write_text("from loop import b\n")
    (tmp_path / "loop" / "b.py").write_text("def f():\n    from loop import a  # inside a function still counts\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles(grimp.build_graph("loop", cache_dir=None)) == [["loop.a", "loop.b"]]


def unexplained_function_imports(path: Path) -> list[str]:
    """Package-internal imports inside a function with no comment on their line or the one
    above saying why (a heavy import kept off `--help`, an optional dependency)."""
    lines = path.read_text().splitlines()
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if in_function and isinstance(child, ast.ImportFrom) and (child.module or "").startswith("dspark_bench"):
                said = "#" in lines[child.end_lineno - 1] or lines[child.lineno - 2].strip().startswith("#")
                if not said:
                    found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{child.lineno}")
            visit(child, inside)

    visit(ast.parse("\n".join(lines)), False)
    return found


def test_imports_inside_functions_say_why():
    found = [where for path in sorted(PACKAGE.rglob("*.py")) for where in unexplained_function_imports(path)]
    assert found == []


def test_the_check_catches_a_silent_import_inside_a_function(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text("from dspark_bench.errors import DsparkError\n\n\ndef f():\n"
                      "    from dspark_bench.config import DecodeConfig\n\n\ndef g():\n"
                      "    from dspark_bench.config import DecodeConfig  # keeps --help fast\n")
    assert unexplained_function_imports(module) == ["probe.py:5"]


def test_the_top_of_the_package_is_a_handful_of_core_modules():
    """The core's words, each one module; the rest lives in layers (issue 63: ten files, __init__ included)."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top


def house_counts():
    import runpy  # a tool's script, not a package module

    return runpy.run_path(str(ROOT / "tools" / "house_counts.py"))


def test_every_module_and_function_stays_within_the_limits():
    """No module over 400 lines and no function over 60, with no waiver (tools/house_counts.py counts
    them for the issue's table; these are the same functions)."""
    tool = house_counts()
    modules = tool["modules"](PACKAGE)
    assert [str(p.relative_to(ROOT)) for p in modules if tool["lines"](p) > 400] == []
    assert [f for p in modules for f in tool["long_functions"](p)] == []


def test_no_private_name_is_imported_across_modules(tmp_path):
    """`from dspark_bench.x import _name`: a name another module needs is public (dunders aside)."""
    tool = house_counts()
    assert [i for p in tool["modules"](PACKAGE) for i in tool["private_imports"](p)] == []
    probe = tmp_path / "probe.py"
    probe.write_text("from dspark_bench.config import _hidden, DecodeConfig\nfrom dspark_bench import __version__\n")
    assert tool["private_imports"](probe) == ["probe.py:_hidden"]


def test_the_command_line_loads_without_torch():
    """`dspark-bench --help` and `tasks ls` stay quick: the CLI's modules import the library (and
    torch) only when a command runs."""
    probe = "import sys, dspark_bench.cli, dspark_bench.tasks; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def torch_importers(package: Path) -> list[str]:
    """Modules under `package` that import torch or transformers themselves (any import statement,
    inside functions too)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(name.split(".")[0] in ("torch", "transformers") for name in names):
                found.append(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name))
                break
    return found


def test_replay_imports_no_torch():
    """replay/ computes from records and cost models; what runs or times models is measure/'s.

    Only replay's own imports are held: importing replay in a fresh interpreter still loads torch,
    through the decoding modules it shares with the decoders (the schedule's rules, the confidence
    signals, goodput's decisions, `Round`), which import torch for the decoders' device code."""
    assert torch_importers(PACKAGE / "replay") == []


def test_the_torch_check_finds_an_import(tmp_path):
    (tmp_path / "a.py").write_text("import numpy\n\n\ndef f():\n    import torch.nn  # late\n")
    (tmp_path / "b.py").write_text("from transformers import DynamicCache\n")
    (tmp_path / "c.py").write_text("from .torch import x\nimport torchvision_like as t\n")
    assert torch_importers(tmp_path) == ["a.py", "b.py"]


def test_no_module_branches_on_a_schedule_s_name(tmp_path):
    """A schedule is one object in dspark_bench/schedules.py; every other module reads its
    properties (tools/schedule_branches.py finds comparisons with a schedule's name)."""
    import runpy  # a tool's script, not a package module

    from dspark_bench import schedules

    tool = runpy.run_path(str(ROOT / "tools" / "schedule_branches.py"))
    assert tool["count"](PACKAGE) == []
    assert set(schedules.SCHEDULES) <= tool["NAMES"]  # it knows every registered schedule's name (depth too)
    # The tool finds what it looks for: one of each kind of branch it counts.
    probe = tmp_path / "probe.py"
    probe.write_text("a = c.stopping.schedule == 'fixed'\nb = t['schedule'] != 'budget'\nd = s in COST_AWARE\n"
                     "e = DecodeConfig.of(schedule='fixed')\nf = t['schedule'].isin(['threshold', 'ramp'])\n")
    assert tool["branches"](probe) == [1, 2, 3, 5]


def test_engine_means_a_serving_engine():
    """The glossary's test (docs/architecture.md): "engine" never names our own decoder
    (tools/engine_words.py lists every line that does)."""
    import runpy  # a tool's script, not a package module

    tool = runpy.run_path(str(ROOT / "tools" / "engine_words.py"))
    assert tool["count"](ROOT) == []
    # It finds what it looks for, and leaves a serving engine and an engine's rule alone (the
    # probes are built here so that this file's own lines do not match).
    engine = "engine"
    lines = [f"timed on our {engine}", f"the batched {engine} drafts", f'{engine.upper()}S = ("llamacpp", "ours")',
             f"llama.cpp's {engine} rule", f"a serving {engine} such as vLLM"]
    assert [bool(tool["FOUND"].search(line)) for line in lines] == [True, True, True, False, False]


def test_each_package_says_what_it_holds():
    """Every package's __init__ names each of its modules (in backticks) in its docstring."""
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        said = ast.get_docstring(ast.parse(init.read_text())) or ""
        for module in sorted(init.parent.glob("*.py")):
            name = module.stem
            if name not in ("__init__", "__main__") and f"`{name}`" not in said and f"`{name}.py`" not in said:
                missing.append(f"{init.parent.relative_to(ROOT)}: {name}")
    assert missing == []


def test_no_line_passes_120_columns():
    """pyproject.toml's [tool.ruff] line length, held by ruff's E501 over the code and its tests."""
    if not RUFF.exists():
        pytest.fail(f"{RUFF} is missing: install the test extras (ruff)")
    done = subprocess.run([str(RUFF), "check", "--select", "E501", "--output-format", "concise", "--no-cache",
                           "dspark_bench", "tests", "tools", "benchmarks"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_schedule_or_metric_name_is_spelt_outside_the_registries():
    """`schedule="fixed"` or `metric == "learned"` outside schedules.py and config.py: the registry's
    names (schedules.BASELINE, config.LEARNED) instead (tools/schedule_branches.py's `literals`)."""
    import runpy  # a tool's script, not a package module

    tool = runpy.run_path(str(ROOT / "tools" / "schedule_branches.py"))
    assert tool["count"](PACKAGE, tool["literals"]) == []


def test_the_literal_finder_finds_literals(tmp_path):
    import runpy  # a tool's script, not a package module

    tool = runpy.run_path(str(ROOT / "tools" / "schedule_branches.py"))
    probe = tmp_path / "probe.py"
    probe.write_text("a = c.replace(schedule='fixed')\nb = m == 'learned'\nd = c.replace(schedule=BASELINE)\n"
                     "e = {'learned': 1}\n")
    assert tool["literals"](probe) == [1, 2]
