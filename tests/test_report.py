"""Plots and `dspark-bench report`: figures from synthetic tables and from real tiny runs."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from cli_helpers import invoke  # noqa: E402  (tests/ is on sys.path, see conftest.py)
from matplotlib.colors import to_rgb

from dspark_bench import objectives
from dspark_bench.reporting import plots
from dspark_bench.reporting.report import build_report, figures_written, load_inputs

# --- synthetic tables ------------------------------------------------------------------------------


def synthetic_policies(replay: bool = False) -> pd.DataFrame:
    """A sweep-like table: top1 and margin thresholds × gamma_max, plus classic fixed gammas."""
    rows = []
    for metric, threshold, gamma_max in itertools.product(("top1", "margin"), (0.2, 0.4, 0.6, 0.8), (2, 4)):
        avg = gamma_max * (1 - threshold) * (0.9 if metric == "margin" else 1.0)
        speedup = 1.0 + 0.5 * np.sin(3 * threshold) * gamma_max / 4 - (0.1 if metric == "margin" else 0)
        rows.append({"config_label": f"{metric} threshold {threshold:g} γ≤{gamma_max} min1", "metric": metric,
                     "schedule": "threshold", "threshold": threshold, "gamma_max": gamma_max, "min_draft_len": 1,
                     "avg_draft_len": avg, "block_acceptance_rate": threshold, "accepted_per_round": avg * 0.7,
                     "tokens_per_round": avg * 0.7 + 1, "speedup": speedup, "speedup_low": speedup - 0.1,
                     "speedup_high": speedup + 0.1})
    for gamma_max in (2, 4):  # classic: faster in this table than any, must still not be "best"
        rows.append({"config_label": f"fixed γ={gamma_max}", "metric": "top1", "schedule": "fixed", "threshold": 0.5,
                     "gamma_max": gamma_max, "min_draft_len": 0, "avg_draft_len": gamma_max,
                     "block_acceptance_rate": 0.3, "accepted_per_round": 1.0, "tokens_per_round": 2.0,
                     "speedup": 3.0, "speedup_low": 2.9, "speedup_high": 3.1})
    table = pd.DataFrame(rows).assign(run_id="20250101-000000-sweep-aaaaaa")
    if replay:  # measured only for a few; the cost model predicts every one
        table["predicted_speedup"] = table["speedup"] * 0.9
        table.loc[table.index[3:], ["speedup", "speedup_low", "speedup_high"]] = np.nan
    return table


def labels(fig) -> list[tuple[str, str]]:
    return [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes if ax.get_visible()]


def star(ax):
    (line,) = [l for l in ax.get_lines() if l.get_marker() == "*"]
    return line.get_xdata()[0], line.get_ydata()[0]


def test_best_row_is_the_best_confidence_scheduled_policy():
    table = synthetic_policies()
    best = plots.best_row(table)
    scheduled = table[table["schedule"] != "fixed"]
    assert best["speedup"] == scheduled["speedup"].max()
    assert plots.best_row(table, fixed=True)["config_label"] in ("fixed γ=2", "fixed γ=4")
    failed = table.assign(state="COMPLETE")
    failed.loc[best.name, "state"] = "FAIL"
    assert plots.best_row(failed)["config_label"] != best["config_label"]


@pytest.mark.parametrize("replay", [False, True])
def test_threshold_curves_mark_the_best_point(replay):
    table = synthetic_policies(replay)
    fig = plots.threshold_curves(table)
    ylabels = [ax.get_ylabel() for ax in fig.axes]
    assert ylabels[:3] == ["avg_draft_len", "block_acceptance_rate", "accepted_per_round / tokens_per_round (dashed)"]
    assert ylabels[3].startswith("speedup")
    assert [ax.get_xlabel() for ax in fig.axes[2:]] == ["threshold", "threshold"]
    best = plots.best_row(table)
    objective = objectives.ranking_column(table)
    assert star(fig.axes[0]) == pytest.approx((best["threshold"], best["avg_draft_len"]))
    assert star(fig.axes[3]) == pytest.approx((best["threshold"], table[table["schedule"] != "fixed"][objective].max()))
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "γ≤2" in legend and "γ≤4" in legend
    if replay:  # the predicted curve is drawn dashed, one per gamma_max
        dashed = [l for l in fig.axes[3].get_lines() if l.get_linestyle() == "--"]
        assert len(dashed) == 2


def test_heatmap_panels_per_metric():
    fig = plots.speedup_heatmap(synthetic_policies())
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in panels) == ["margin · threshold · speedup", "top1 · threshold · speedup"]
    assert all(labels == ("threshold", "gamma_max") for labels in
               [(ax.get_xlabel(), ax.get_ylabel()) for ax in panels])
    assert plots.heatmap_value(synthetic_policies(replay=True)) == "predicted_speedup"


def test_roc_auc_equals_the_pairwise_definition():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, 200) / 5  # many ties
    accepted = rng.random(200) < scores
    pairs = [(s_pos > s_neg) + 0.5 * (s_pos == s_neg) for s_pos in scores[accepted] for s_neg in scores[~accepted]]
    assert plots.roc_auc(scores, accepted) == pytest.approx(np.mean(pairs))
    assert plots.roc_auc([0.1, 0.2, 0.8, 0.9], [False, False, True, True]) == 1.0
    assert np.isnan(plots.roc_auc([0.1, 0.2], [True, True]))


def test_confidences_from_rounds_keep_drafted_tokens_up_to_the_first_rejection():
    rounds = pd.DataFrame({"metric": ["top1", "top1", "top1"], "drafted": [2, 3, 0], "accepted": [1, 3, 0],
                           # round 1: third confidence is the dropped proposal; round 3: budget, nothing drafted
                           "confidences": [[0.9, 0.4, 0.1], [0.95, 0.9, 0.8], []]})
    table = plots.confidences_from_rounds(rounds)
    assert table["confidence"].tolist() == [0.9, 0.4, 0.95, 0.9, 0.8]
    assert table["accepted"].tolist() == [True, False, True, True, True]
    fig = plots.reliability(table)
    assert labels(fig) == [("", "acceptance (share of drafted tokens accepted)"), ("confidence (bin)", "tokens")]


def test_confidences_from_record_condition_on_the_matched_prefix():
    matches = np.array([[2, 0, 1]])  # M[p, j]
    confidence = np.arange(9, dtype=float).reshape(1, 3, 3) / 10
    table = plots.confidences_from_record({"top1": confidence}, matches, np.array([3]))
    # j=0: steps 0, 1 accepted, step 2 rejected (k <= M); j=1: step 0 rejected; j=2: step 0 only (j + k < 3)
    assert table["confidence"].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.6])
    assert table["accepted"].tolist() == [True, True, False, False, True]


def synthetic_samples() -> pd.DataFrame:
    rows = []
    for prompt, category in enumerate(["code", "code", "prose", "math"]):
        for label, schedule, speed in (("top1 threshold 0.4 γ≤4 min1", "threshold", 1.6), ("fixed γ=4", "fixed", 1.2)):
            rows.append({"prompt_id": prompt, "category": category, "config_label": label, "schedule": schedule,
                         "baseline_time_s": 1.0 + prompt * 0.1, "spec_time_s": (1.0 + prompt * 0.1) / speed,
                         "baseline_new_tokens": 100, "new_tokens": 100,
                         "rounds": 10, "position_drafted": [9, 6, 3, 1], "position_accepted": [8, 4, 1, 0],
                         "stop_threshold": 6, "stop_gamma_max": 1, "stop_eos": 0, "stop_budget": 3})
    return pd.DataFrame(rows)


def test_position_acceptance_stop_reasons_and_bars():
    samples = synthetic_samples()
    fig = plots.position_acceptance(samples, ["top1 threshold 0.4 γ≤4 min1", "fixed γ=4"])
    assert labels(fig) == [("draft position k", "per-position acceptance (accepted / drafted)")]
    first = fig.axes[0].get_lines()[0]
    assert first.get_ydata() == pytest.approx([8 / 9, 4 / 6, 1 / 3, 0])
    lengths = plots.draft_lengths_from_positions(samples[samples["schedule"] == "fixed"])
    assert lengths.tolist() == [4, 12, 12, 8, 4]  # 40 rounds: L = 0 .. 4
    fig = plots.stop_reasons(samples[samples["schedule"] == "fixed"])
    assert labels(fig) == [("stop reason", "rounds"), ("drafted tokens per round (L)", "rounds")]
    assert [p.get_height() for p in fig.axes[0].patches] == [24, 4, 0, 12]
    roles = samples.assign(role=np.where(samples["schedule"] == "fixed", "classic", "best"))
    fig = plots.speedup_by_group(roles)
    assert labels(fig) == [("category", "speedup (95% bootstrap CI)")]
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["code", "prose", "math", "all"]
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert heights[:4] == pytest.approx([1.6] * 4) and heights[4:] == pytest.approx([1.2] * 4)


def test_round_trace_draws_every_round():
    rounds = pd.DataFrame({"prompt_id": 0, "config_label": "a", "round": [0, 1, 2], "drafted": [3, 2, 0],
                           "accepted": [1, 2, 0], "emitted": [2, 3, 1]})
    fig = plots.round_trace(rounds)
    ax = fig.axes[0]
    colors = [tuple(np.round(p.get_facecolor()[:3], 3)) for p in ax.patches]
    green, red, blue = (tuple(np.round(np.array(to_rgb(plots.COLORS[k])), 3))
                        for k in ("accepted", "rejected", "target"))
    assert colors.count(green) == 3 and colors.count(red) == 2 and colors.count(blue) == 3
    assert ax.get_xlabel() == "generated token position"


def test_optuna_views_from_studies():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = {"threshold": optuna.distributions.FloatDistribution(0, 1),
                     "gamma_max": optuna.distributions.IntDistribution(1, 8)}
    single = optuna.create_study(direction="maximize")
    pareto = optuna.create_study(directions=["maximize", "maximize"])
    for i in range(8):
        params = {"threshold": i / 8, "gamma_max": 1 + i % 4}
        single.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=1 + i % 3))
        pareto.add_trial(optuna.trial.create_trial(params=params, distributions=distributions,
                                                   values=[1 + i % 3, 3 - i % 3]))
    fig = plots.param_importances(single, "speedup")
    assert fig.axes and "Importance" in fig.axes[0].get_xlabel()
    fig = plots.pareto_front(pareto, ["speedup", "tokens_per_round"])
    assert (fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()) == ("speedup", "tokens_per_round")
    with pytest.raises(ValueError):
        plots.pareto_front(single, ["speedup"])
    lonely = optuna.create_study(direction="maximize")
    lonely.add_trial(optuna.trial.create_trial(params={"threshold": 0.5, "gamma_max": 2}, distributions=distributions,
                                               value=1.0))
    with pytest.raises(ValueError, match="nothing to rank"):
        plots.param_importances(lonely)
    trials = pd.DataFrame({"trial": range(5), "state": ["COMPLETE"] * 4 + ["FAIL"], "objective_0": [1, 3, 2, 4, None]})
    fig = plots.optimization_history(trials)
    assert labels(fig) == [("trial", "speedup")]
    assert list(fig.axes[0].get_lines()[1].get_ydata()) == [1, 3, 3, 4]
    import matplotlib

    assert matplotlib.rcParams["axes.facecolor"] == "white"  # optuna's ggplot style did not leak


# --- real tiny runs through the CLI ----------------------------------------------------------------


@pytest.fixture(scope="module")
def results(saved_pair, tmp_path_factory):
    """A traced run (with a classic fixed gamma), a replay sweep and a real grid sweep."""
    root = tmp_path_factory.mktemp("report")
    prompts = root / "prompts.jsonl"
    rows = [{"prompt": "def add(a, b):", "category": "code"}, {"prompt": "The quick brown fox", "category": "prose"},
            {"prompt": "for i in range(", "category": "code"}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    target, draft = saved_pair
    out = root / "results"
    common = ["--target", target, "--draft", draft, "--dataset", prompts, "--max-new-tokens", "12", "--out", out]
    runs = {}
    for name, args in {
        "run": ["run", "--schedule", "threshold", "--schedule", "fixed", "--threshold", "0.2", "--threshold", "0.5",
                "--gamma-max", "3", "--repeats", "1", "--trace"],
        "replay": ["sweep", "--threshold", "0.2", "--threshold", "0.5", "--gamma-max", "2", "--gamma-max", "3",
                   "--metric", "top1", "--metric", "margin", "--confirm-top", "2"],
        "grid": ["sweep", "--evaluation", "real", "--method", "grid", "--threshold", "0.2", "--threshold", "0.5",
                 "--gamma-max", "2", "--gamma-max", "3"],
    }.items():
        before = set(out.iterdir()) if out.exists() else set()
        result = invoke(*args, *common)
        assert result.exit_code == 0, result.output
        (runs[name],) = [p for p in set(out.iterdir()) - before if p.name != "records"]
    return runs


def digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "plots" not in p.parts and p.name[:7] != "report."}


def test_report_of_a_traced_run(results):
    folder = results["run"]
    before = digest(folder)
    result = invoke("report", folder)
    assert result.exit_code == 0, result.output
    assert digest(folder) == before  # results untouched
    text = (folder / "report.md").read_text()
    summary = text.split("## Figures")[0]
    inputs = load_inputs([folder])
    best = plots.best_row(inputs.policies)
    assert f"| best | {best['config_label']} | {best['speedup']:.2f}×" in summary
    assert "| classic (best fixed γ) | fixed γ=3 |" in summary and "| autoregressive |" in summary
    assert "### Environment" in summary and "cpu · float32" in summary
    assert "By depth" not in summary  # short prompts: every round in one depth bucket, nothing new to show
    verdict = json.loads((folder / "summary.json").read_text())["timing_health"]["verdict"]
    assert "Timing health: " in summary and f"| {plots.short_run(folder.name)} | {verdict} |" in summary
    figures = figures_written(folder / "report.md")
    assert figures == [f"plots/{n}.png" for n in ("threshold_curves", "speedup_heatmap", "position_acceptance",
                                                   "reliability", "stop_reasons", "best_vs_classic", "round_trace",
                                                   "paired_ratios")]
    assert "11. Paired on the same prompts" in text and "Headline: " in text  # the run timed a fixed γ beside others
    for figure in figures:
        assert (folder / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # No sweep: no Optuna views; the report says so and draws nothing for them.
    assert "7. Optuna study: skipped, no real (grid or Optuna) sweep" in text
    assert not list(folder.glob(".*partial")) and not list((folder / "plots").glob(".*"))
    # The trace's draft lengths equal those derived from the samples' per-position counts.
    samples, rounds = inputs.samples, inputs.rounds
    label = best["config_label"]
    traced = rounds[rounds["config_label"] == label]["drafted"].value_counts().sort_index()
    derived = plots.draft_lengths_from_positions(samples[samples["config_label"] == label])
    assert derived[derived > 0].to_dict() == traced.to_dict()


def test_report_of_a_replay_sweep_uses_the_record(results, tmp_path):
    result = invoke("report", results["replay"], "--out", tmp_path / "out", "--format", "svg")
    assert result.exit_code == 0, result.output
    text = (tmp_path / "out" / "report.md").read_text()
    assert "### Cost model accuracy" in text and "measured / predicted" in text
    assert "Source: replay record" in text
    for metric in ("top1", "entropy", "topk_mass", "margin"):  # the record has every metric
        assert metric in (tmp_path / "out" / "plots" / "reliability.svg").read_text()
    assert "plots/speedup_heatmap.svg" in text and "predicted_speedup" in text
    assert not (results["replay"] / "report.md").exists()  # --out: nothing written into the run


def test_report_of_a_grid_sweep_has_optuna_views(results, tmp_path):
    build_report([results["grid"]], out=tmp_path)
    figures = figures_written(tmp_path / "report.md")
    assert "plots/optuna_history.png" in figures and "plots/optuna_importances.png" in figures
    assert "plots/speedup_heatmap.png" in figures


def test_comparing_runs_and_rewriting_a_report(results, tmp_path):
    paths = [results["run"], results["replay"], results["grid"]]
    first = build_report(paths, out=tmp_path, by="run")
    text = first.read_text()
    assert "### Per run" in text and text.count("| run-") + text.count("| sweep-") >= 6
    old = (tmp_path / "plots" / "best_vs_classic.png").read_bytes()
    assert build_report(paths, out=tmp_path, by="category") == first  # replaced in place, atomically
    assert (tmp_path / "plots" / "best_vs_classic.png").read_bytes() != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots", "report.html", "report.md"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def browse(html: str, tmp_path, script: str, width: int = 1280) -> str:
    """The page's title after `script` ran on load, in headless Chromium at `width` pixels."""
    browser = chromium()
    if browser is None:
        pytest.skip("chromium not installed")
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", f"<script>window.addEventListener('load', () => {{ {script} }});"
                                             "</script></body>"))
    out = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                          f"--window-size={width},900", "--hide-scrollbars", "--virtual-time-budget=5000", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=120)
    title = re.search(r"<title>(.*?)</title>", out.stdout)
    assert title, out.stderr[-2000:]
    return title.group(1)


def test_report_html_images_load_in_a_browser(results, tmp_path):
    html = build_report([results["run"], results["replay"]], out=tmp_path).with_name("report.html").read_text()
    images = re.findall(r'<img alt="[^"]*" src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == html.count("<img") >= 6
    assert all(base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n" for data in images)
    if chromium() is None:
        pytest.skip("chromium not installed: images checked as valid PNG data URIs only")
    # Count the images the browser decoded into the title.
    title = browse(html, tmp_path, "const i = [...document.images]; document.title = 'loaded ' + "
                   "i.filter(x => x.complete && x.naturalWidth > 0).length + ' of ' + i.length;")
    assert title == f"loaded {len(images)} of {len(images)}"


def test_report_tables_fit_a_1280_pixel_window(results, tmp_path):
    # Two runs side by side give the widest tables: per-run rows, long model paths.
    html = build_report([results["run"], results["replay"]], out=tmp_path).with_name("report.html").read_text()
    tables = html.count("<table>")
    assert tables >= 3 and html.count('<div class="table-box">') == tables
    title = browse(html, tmp_path, "const w = window.innerWidth; const t = [...document.querySelectorAll('table')]; "
                   "document.title = 'viewport ' + w + ' page ' + document.documentElement.scrollWidth + ' tables ' + "
                   "t.length + ' widest ' + Math.max(...t.map(x => Math.ceil(x.getBoundingClientRect().right)));")
    found = re.fullmatch(r"viewport (\d+) page (\d+) tables (\d+) widest (\d+)", title)
    assert found, title
    viewport, page, count, widest = map(int, found.groups())
    assert viewport == 1280 and count == tables
    assert widest <= viewport and page <= viewport, title


@pytest.mark.parametrize("args,message", [
    (["/nonexistent/run"], "is not a run folder"),
    (["RESULTS", "--format", "jpg"], "--format must be one of png, svg"),
    (["RESULTS", "--by", "colour"], "--by must be one of category, task, run"),
])
def test_bad_input_is_one_line_and_exit_1(results, args, message):
    args = [str(results["run"]) if a == "RESULTS" else a for a in args]
    result = invoke("report", *args)
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_report_command_has_help_with_an_example():
    result = invoke("report", "--help")
    assert result.exit_code == 0 and "Example: dspark-bench report" in result.output


def test_published_results_appear_for_benchmark_tasks_only():
    from types import SimpleNamespace

    from dspark_bench.reporting.text import literature_blocks

    def for_task(task):
        return literature_blocks(SimpleNamespace(infos={"r": {"prompts": {"task": task}}}))

    assert for_task("code") == [] and for_task(None) == []
    (_, heading), (_, text), (_, header, rows) = for_task("code,humaneval")
    assert "not measured here" in text and header[-1] == "source"
    assert rows and all("HumanEval" in r[0] or "code" in r[0].lower() for r in rows)
    chat = for_task("mt-bench")[2][2]
    assert chat and all("MT-Bench" in r[0] for r in chat) and all(r[-1] for r in chat)  # every row cites its source


def test_a_sweep_confirmed_in_an_engine_leads_its_report_with_that_engines_verdict():
    """summary.json's engine_verdict (sweep --prices llamacpp, confirmed in llama-server) is the
    report's first word, as the command line and export say it."""
    from types import SimpleNamespace

    from dspark_bench.reporting.report_inputs import section_blocks
    from dspark_bench.reporting.text import to_html, to_markdown
    from dspark_bench.sections.base import SUMMARY_HEAD

    verdict = {"engine": "llama.cpp b11434", "sentence": "in llama.cpp b11434 here, plain decoding wins: the best "
               "policy measured 0.86× [0.79, 0.95] (fixed γ=3)", "measured_in": "llama-server's generation phase",
               "rows": [{"policy": "fixed γ=3", "predicted": 0.81, "measured": 0.861, "measured_low": 0.79,
                         "measured_high": 0.95, "acceptance_rate": 0.44}]}
    inputs = SimpleNamespace(summaries={"sweep-a": {"engine_verdict": verdict}, "run-b": {}})
    blocks = section_blocks(inputs, SUMMARY_HEAD)
    assert [b[0] for b in blocks] == ["p", "table"]
    assert "plain decoding wins" in blocks[0][1] and blocks[1][2] == [["fixed γ=3", "0.810", "0.861× [0.79, 0.95]",
                                                                    "0.44"]]
    assert "plain decoding wins" in to_markdown(blocks) and "plain decoding wins" in to_html(blocks, "t")
    assert section_blocks(SimpleNamespace(summaries={"run-b": {}}), SUMMARY_HEAD) == []
