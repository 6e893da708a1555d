"""Sweeps: grid and Optuna on one objective, resumable, distributed, and replayed."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from contextlib import closing, contextmanager
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
from typer.testing import CliRunner

from dspark_bench.cli import app
from dspark_bench.decoding.confidence import SIGNALS
from dspark_bench.errors import DsparkError
from dspark_bench.results import load
from dspark_bench.tuning import spec as sweep_spec
from dspark_bench.tuning import spec_files
from dspark_bench.tuning import study as studies
from dspark_bench.tuning import sweep as sweeps

runner = CliRunner()
COMPLETE = optuna.trial.TrialState.COMPLETE


def base_args(saved_pair, prompts_file, out) -> list[str]:
    target, draft = saved_pair
    return ["sweep", "--target", target, "--draft", draft, "--dataset", str(prompts_file), "--out", str(out),
            "--max-new-tokens", "12", "--threshold", "0.2", "--threshold", "0.6", "--gamma-max", "2",
            "--gamma-max", "4"]


def real_spec(saved_pair, prompts_file):
    """A real (timed) sweep of 2 thresholds × 2 gamma_max on the saved pair and prompts."""
    target, draft = saved_pair
    return spec_files.load_spec(None, {"target": target, "draft": draft, "dataset": str(prompts_file),
                                       "evaluation": "real", "max_new_tokens": 12, "space.threshold": [0.2, 0.6],
                                       "space.gamma_max": [2, 4]})


def only_folder(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if not p.name.startswith(".") and p.name != "records"]
    return folder


def grid_points(study: optuna.Study) -> list[tuple]:
    return [(t.params["threshold"], t.params["gamma_max"]) for t in study.get_trials(states=(COMPLETE,))]


def load_study(folder: Path) -> optuna.Study:
    info = json.loads((folder / "run.json").read_text())
    return optuna.load_study(study_name=info["study"], storage=info["storage"])


def test_grid_runs_every_point_exactly_once(saved_pair, prompts_file, tmp_path):
    result = runner.invoke(app, base_args(saved_pair, prompts_file, tmp_path) + ["--evaluation", "real"])
    assert result.exit_code == 0, result.output
    assert "trials · best" in result.output and "4/4" in result.output
    folder = only_folder(tmp_path)
    points = grid_points(load_study(folder))
    assert sorted(points) == [(0.2, 2), (0.2, 4), (0.6, 2), (0.6, 4)]
    trials = load(folder)
    assert len(trials) == 4 and (trials["identical_to_baseline"] == 1.0).all()
    assert {"speedup", "tokens_per_round", "acceptance_rate", "avg_draft_len"} <= set(trials.columns)
    samples = pd.read_parquet(folder / "samples.parquet")
    assert len(samples) == 4 * 3  # trials × prompts
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["best"][0]["speedup"] == trials["speedup"].max()


def test_invalid_points_are_never_run(saved_pair, prompts_file, tmp_path):
    args = base_args(saved_pair, prompts_file, tmp_path) + ["--evaluation", "real", "--min-draft-len", "0",
                                                            "--min-draft-len", "3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    trials = load(only_folder(tmp_path))
    complete = trials[trials["state"] == "COMPLETE"]
    assert len(complete) == 6 and (complete["min_draft_len"] <= complete["gamma_max"]).all()
    assert (trials["state"] == "PRUNED").sum() == 2  # (min 3, gamma 2) × 2 thresholds


def test_optuna_study_improves_on_its_first_trial(saved_pair, prompts_file, tmp_path):
    args = base_args(saved_pair, prompts_file, tmp_path)[:-8] + [
        "--evaluation", "real", "--method", "optuna", "--trials", "5", "--objective", "tokens_per_round",
        "--threshold", "0.1", "--threshold", "0.3", "--threshold", "0.5", "--threshold", "0.8",
        "--gamma-max", "2", "--gamma-max", "4", "--metric", "top1", "--metric", "margin"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    study = load_study(only_folder(tmp_path))
    complete = study.get_trials(states=(COMPLETE,))
    assert len(complete) == 5
    assert study.best_value >= complete[0].value
    assert len({tuple(sorted(t.params.items())) for t in complete}) >= 2


def test_failing_trial_is_recorded_and_the_sweep_goes_on(saved_pair, prompts_file, tmp_path, monkeypatch):
    from dspark_bench.harness import runner as runner_module

    real_run = runner_module.run

    def flaky(pair, prompts, configs, settings, progress=None):
        if configs[0].stopping.threshold == 0.6 and configs[0].stopping.gamma_max == 4:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real_run(pair, prompts, configs, settings, progress)

    monkeypatch.setattr(runner_module, "run", flaky)
    spec = real_spec(saved_pair, prompts_file)
    folder = sweeps.run_sweep(spec, tmp_path).folder
    trials = load(folder)
    assert sorted(trials["state"]) == ["COMPLETE", "COMPLETE", "COMPLETE", "FAIL"]
    failed = trials[trials["state"] == "FAIL"].iloc[0]
    assert "out of memory" in failed["error"]


def test_ctrl_c_keeps_finished_trials_and_resume_reruns_the_interrupted_one(saved_pair, prompts_file, tmp_path,
                                                                            monkeypatch):
    from dspark_bench.harness import runner as runner_module

    real_run, calls = runner_module.run, []

    def interrupted(pair, prompts, configs, settings, progress=None):
        calls.append(configs[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run(pair, prompts, configs, settings, progress)

    monkeypatch.setattr(runner_module, "run", interrupted)
    spec = real_spec(saved_pair, prompts_file)
    with pytest.raises(KeyboardInterrupt):
        sweeps.run_sweep(spec, tmp_path)
    folder = only_folder(tmp_path)
    # The interrupted trial failed and is queued again (WAITING) for --resume.
    assert json.loads((folder / "summary.json").read_text())["trial_states"] == {"COMPLETE": 1, "FAIL": 1, "WAITING": 1}
    sweeps.continue_sweep(folder)
    study = load_study(folder)
    assert sorted(grid_points(study)) == [(0.2, 2), (0.2, 4), (0.6, 2), (0.6, 4)]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--set", "colour=red"], "unknown key(s) colour"),
        (["--set", "space={}"], "search space is empty"),
        (["--set", "space.threshold={low: 0.9, high: 0.1}"], "is above high"),
        (["--threshold", "1.5"], "threshold must be in [0, 1] (got 1.5)"),
        (["--set", "space.gamma_max=[]"], "space.gamma_max is empty"),
        (["--set", "space.min_draft_len=[9]"], "no valid point"),
        (["--objective", "happiness"], "unknown objective"),
        (["--set", "trials=x"], "trials must be an integer"),
        (["--set", "space.gamma_max={low: 2, high: 4, step: 0}"], "step must be positive"),
        (["--set", "space.threshold=[0.2,"], "not a valid YAML value"),
        (["--set", "space.threshold=abc"], "must be a finite number"),
        (["--limit", "0"], "limit must be at least 1 (got 0)"),
        (["--set", "temperatures=[0.5, 0.5]"], "temperatures must be a list of distinct numbers >= 0"),
        (["--set", "temperatures=[0, -1]"], "temperatures must be a list of distinct numbers >= 0"),
    ],
)
def test_bad_specs_fail_in_one_line(flags, message, saved_pair, prompts_file, tmp_path):
    result = runner.invoke(app, base_args(saved_pair, prompts_file, tmp_path) + flags)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not [p for p in tmp_path.iterdir() if p.name != "records"]


def test_spec_files_parse():
    for path in sorted(Path(__file__).parent.parent.joinpath("sweeps").glob("*.yaml")):
        spec = spec_files.load_spec(path, {})
        assert sweep_spec.points(spec), path


def test_sweep_without_a_spec_takes_the_tasks_own_or_a_dense_default(tmp_path, monkeypatch):
    spec, origin = spec_files.resolve_spec(None, {"task": "code"})
    assert "code.yaml, the task's own spec" in origin and len(sweep_spec.points(spec)) == 2736
    monkeypatch.setattr(spec_files, "SPEC_FOLDERS", (tmp_path,))  # a task without a spec file
    spec, origin = spec_files.resolve_spec(None, {"task": "code"})
    configs = sweep_spec.points(spec)
    assert len(configs) == 4 * 2 * 19 * (8 * 3 - 1) == 3496 and "dense default (3,496 points" in origin
    assert ({c.stopping.gamma_max for c in configs} == set(range(1, 9))
            and {c.stopping.min_draft_len for c in configs} == {0, 1, 2})
    assert {c.stopping.metric for c in configs} == {"top1", "entropy", "topk_mass", "margin"}
    assert sorted({c.stopping.threshold for c in configs}) == pytest.approx([round(0.05 * i, 2) for i in range(1, 20)])
    # Sampling replays too: the dense default; real evaluation a small grid, said as such.
    spec, origin = spec_files.resolve_spec(None, {"task": "code", "temperature": 0.8})
    assert len(sweep_spec.points(spec)) == 3496 and "dense default" in origin
    spec, origin = spec_files.resolve_spec(None, {"task": "code", "temperature": 0.8, "evaluation": "real"})
    assert len(sweep_spec.points(spec)) == 3 and "real evaluation needs a timed run" in origin
    # Flags narrow the space from the small base, whatever spec files exist.
    spec, origin = spec_files.resolve_spec(None, {"task": "code", "space.threshold": [0.4]})
    assert len(sweep_spec.points(spec)) == 1 and "command-line flags (1 point)" in origin


def test_replay_sweep_confirms_its_best_policies(saved_pair, prompts_file, tmp_path):
    from dspark_bench.objectives import rank

    args = base_args(saved_pair, prompts_file, tmp_path) + ["--metric", "top1", "--metric", "entropy",
                                                            "--confirm-top", "4"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(only_folder(tmp_path) / "trials.parquet")
    confirmed = table[table["source"] == "confirmed"]
    # --confirm-top 4: four policies in all — the best, then the best learned, goodput and budget
    # policy where not already among them, then the next best — and the best fixed γ beside them.
    ranked = rank(table[table["schedule"] != "fixed"], "speedup", "predicted_speedup")
    per_row = ranked[~ranked["schedule"].isin(["goodput", "budget"])]
    leaders = [ranked.iloc[0]["config_label"], per_row[per_row["metric"] == "learned"].iloc[0]["config_label"],
               *(ranked[ranked["schedule"] == kind].iloc[0]["config_label"] for kind in ("goodput", "budget"))]
    expected = list(dict.fromkeys(leaders + list(ranked["config_label"])))[:4]
    assert set(confirmed[confirmed["schedule"] != "fixed"]["config_label"]) == set(expected)
    count = 5
    assert len(confirmed) == count and f"confirming the best {count}" in result.output
    # Policies whose replayed rounds are identical are timed once and share the measurement.
    twins = confirmed[confirmed["same_as"].notna()]
    timed = count - len(twins)
    assert f"{3 * timed}/{3 * timed}" in result.output  # × 3 prompts
    for twin in twins.itertuples():
        (original,) = confirmed[confirmed["config_label"] == twin.same_as].itertuples()
        assert ((twin.speedup, twin.tokens_per_round, twin.drafted_total)
                == (original.speedup, original.tokens_per_round, original.drafted_total))
    summary = json.loads((only_folder(tmp_path) / "summary.json").read_text())
    assert summary["headline"]["reference"].startswith("fixed γ=") and "scheduled vs best fixed γ" in result.output
    assert "search space: the command-line flags (8 points)" in result.output
    assert "plan: record 3 prompts × 12 tokens" in result.output and "confirm 5 × 3 prompts" in result.output
    assert "simulate 26 policies (8 points + 18 replay adds" in " ".join(result.output.split())
    # The grid, two fixed gammas, four goodput, four budget, eight learned.
    assert "26 policies searched by replay" in result.output
    folder = only_folder(tmp_path)
    table = pd.read_parquet(folder / "trials.parquet")
    # The grid, fixed gamma 2 and 4 as the classic baseline, goodput and budget at each metric and
    # gamma_max, and the learned signal in place of the first metric in every scheduled policy
    # (goodput's and budget's included).
    assert len(table) == 2 * 2 * 2 + 2 + 2 * 2 + 2 * 2 + (4 + 2 + 2)
    assert (table["schedule"] == "goodput").sum() == 4 + 2 and (table["schedule"] == "budget").sum() == 4 + 2
    learned_rows = table[table["metric"] == "learned"]
    assert (len(learned_rows) == 8
            and set(learned_rows["signal_model"]) == {str((folder / "learned_signal.json").resolve())})
    confirmed = table[table["source"] == "confirmed"]
    assert (confirmed["schedule"] == "fixed").sum() == 1
    assert (confirmed["schedule"] == "goodput").sum() >= 1 and (confirmed["schedule"] == "budget").sum() >= 1
    assert ((confirmed["metric"] == "learned") & ~confirmed["schedule"].isin(["goodput", "budget"])).sum() >= 1
    # Its acceptance fit sits beside the record; the sweep's goodput model holds it and the costs.
    (record_dir,) = (tmp_path / "records").iterdir()
    model = json.loads((folder / "goodput_model.json").read_text())
    assert model["acceptance"] == json.loads((record_dir / "acceptance.json").read_text())
    assert set(model["acceptance"]["quality"]) == {"top1", "entropy", "topk_mass", "margin", "gini"}  # config.METRICS
    assert set(confirmed["goodput_model"]) >= {str((folder / "goodput_model.json").resolve())}
    best_predicted = table[table["schedule"] != "fixed"]["predicted_speedup"].max()
    assert best_predicted in confirmed["predicted_speedup"].to_list()
    assert (confirmed["identical_to_baseline"] == 1.0).all()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["cost_model_accuracy"]["measured_over_predicted_median"] > 0
    # The learned signal's fit saved beside the record and in the sweep.
    fitted = json.loads((folder / "learned_signal.json").read_text())
    assert fitted == json.loads((record_dir / "learned_signal.json").read_text()) and fitted["prompts"] == 3
    # The analyses are not run unless asked: the output says where they are.
    assert not (folder / "analysis.json").exists() and "headroom" not in summary
    assert "acceptance signals, held out by prompt" not in result.output
    assert f"more: dspark-bench analyze {folder}" in " ".join(result.output.split())
    analyze_afterwards(folder)
    # Its timings judged, every check named, and the verdict printed under the table.
    timing = summary["timing_health"]
    names = {c["name"] for c in timing["checks"]}
    assert names >= {"cost_dispersion", "cost_monotone", "load_drift", "load_dispersion", "measured_over_predicted"}
    # Only when they apply: equal rounds among the confirmed, several threads, a job estimated at 30 s or more.
    assert names - {"cost_dispersion", "cost_monotone", "load_drift", "load_dispersion",
                    "measured_over_predicted"} <= {"identical_rounds", "thread_scaling", "wall_over_estimate"}
    assert f"timings {timing['verdict']}" in result.output
    assert summary["predictions_trusted"] == (all(c["verdict"] != "unreliable" for c in timing["checks"][:2]))
    # A second sweep on the same pair and prompts reuses the record.
    records = list((tmp_path / "records").iterdir())
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and list((tmp_path / "records").iterdir()) == records



def test_confirm_top_zero_is_replays_answer_alone(saved_pair, prompts_file, tmp_path):
    """--confirm-top 0: nothing is timed; the summary and the table give the best predicted policy
    of each schedule, and the output says so."""
    refused = runner.invoke(app, base_args(saved_pair, prompts_file, tmp_path) + ["--confirm-top", "0",
                                                                                "--precision", "0.03"])
    assert refused.exit_code == 1 and "--confirm-top 0 times nothing" in refused.output
    result = runner.invoke(app, base_args(saved_pair, prompts_file, tmp_path) + ["--confirm-top", "0"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "nothing timed (--confirm-top 0)" in said and "replay's answer alone" in said and "confirming" not in said
    folder = only_folder(tmp_path)
    table = pd.read_parquet(folder / "trials.parquet")
    summary = json.loads((folder / "summary.json").read_text())
    assert (table["source"] == "replay").all() and not (folder / "samples.parquet").exists()
    assert summary["confirmed"] == [] and summary["cost_model_accuracy"] is None and "headline" not in summary
    scheduled = table[table["schedule"] != "fixed"]
    assert summary["best"][0]["predicted_speedup"] == scheduled["predicted_speedup"].max()
    assert summary["classic"][0]["predicted_speedup"] == table[table["schedule"] == "fixed"]["predicted_speedup"].max()
    # The report says nothing was measured, with no empty table of measurements.
    report = runner.invoke(app, ["report", str(folder), "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    text = (tmp_path / "report" / "report.md").read_text()
    assert "nothing timed (--confirm-top 0): every speedup here is predicted" in text
    assert "| measured / predicted |" not in text

def analyze_afterwards(folder: Path) -> None:
    """`dspark-bench analyze` on a finished sweep: the three analyses, every signal's held-out
    quality among them, written into analysis.json, and nothing else in the folder changed."""
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    studied = runner.invoke(app, ["analyze", str(folder)])
    assert studied.exit_code == 0, studied.output
    analysis = json.loads((folder / "analysis.json").read_text())
    assert [r["signal"] for r in analysis["signals"]] == [*SIGNALS, "learned"]
    assert all(0 <= r["brier"] <= 1 and r["tokens"] > 0 for r in analysis["signals"])
    assert analysis["headroom"] and analysis["signal_headroom"]
    assert "acceptance signals, held out by prompt" in studied.output and "headroom (predicted)" in studied.output
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != "analysis.json"} == before
    assert runner.invoke(app, ["analyze", str(folder.parent / "no-such-sweep")]).exit_code == 1


def test_replay_sweep_over_batch_sizes_confirms_the_best_at_each(saved_pair, prompts_file, tmp_path):
    from dspark_bench.reporting.report import build_report, figures_written

    # --confirm-top 4: at each B the best, then the best learned, goodput and budget policy; and
    # every policy replayed under load at two arrival rates.
    args = base_args(saved_pair, prompts_file, tmp_path) + ["--batch-size", "1", "--batch-size", "2",
                                                            "--confirm-top", "4", "--analyze", "--arrival-rate", "50",
                                                            "--arrival-rate", "0.5", "--requests", "12"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    # Per batch size: 4 + 2 fixed γ + 2 goodput + the budget (2 at B = 1, 2 × 2 layouts at B = 2) + learned.
    assert "40 policies searched by replay" in result.output
    folder = only_folder(tmp_path)
    table = pd.read_parquet(folder / "trials.parquet")
    assert sorted(table["batch_size"].unique()) == [1, 2] and len(table) == (4 + 2 + 2 + 2 + 8) + (4 + 2 + 2 + 4 + 10)
    assert (set(table.loc[(table["schedule"] == "budget") & (table["batch_size"] == 2), "budget_layout"])
            == {"padded", "packed"})
    confirmed = table[table["source"] == "confirmed"]
    # Per B: the best scheduled, the best learned, goodput and budget (where not the same), fixed γ.
    assert (confirmed["batch_size"] == 1).sum() >= 4 and (confirmed["batch_size"] == 2).sum() >= 4
    assert sorted(set(confirmed.loc[confirmed["schedule"] == "budget", "batch_size"])) == [1, 2]
    assert confirmed[confirmed["metric"] == "learned"]["batch_size"].nunique() == 2
    assert (confirmed["identical_to_baseline"] == 1.0).all()
    for _, group in table.groupby("batch_size"):  # packed never pays for padding
        assert (group["predicted_time_packed"] <= group["predicted_time"] * (1 + 1e-9)).all()
    summary = json.loads((folder / "summary.json").read_text())
    assert [entry["batch_size"] for entry in summary["by_batch_size"]] == [1, 2]
    for entry in summary["by_batch_size"]:
        assert len(entry["measured"]) >= 4 and entry["cost_model_accuracy"]["measured_over_predicted_median"] > 0
        assert entry["packed_predicted"]["scheduled_over_fixed"] > 0
    assert json.loads((folder / "cost_surface.json").read_text())["batch_sizes"].keys() == {"1", "2"}
    # The headroom per B and layout: no policy of the space is predicted above the oracle (but the
    # budget schedule at B > 1, which decides for the batch, where the oracle is per-row perfect stopping).
    analysis = json.loads((folder / "analysis.json").read_text())  # --analyze: the analyses ran in the sweep
    bound = {(r["batch_size"], r["layout"]): r for r in analysis["headroom"]}
    assert sorted(bound) == [(1, "—"), (2, "packed"), (2, "padded")]
    for (batch_size, layout), row in bound.items():
        column = "predicted_speedup_packed" if layout == "packed" else "predicted_speedup"
        per_row = table[(table["batch_size"] == batch_size) & ((table["schedule"] != "budget") | (batch_size == 1))]
        assert per_row[column].max() <= row["oracle_speedup"] + 1e-9
        budget = table[(table["batch_size"] == batch_size) & (table["schedule"] == "budget")][column].max()
        assert row["best_budget_speedup"] == pytest.approx(budget) and row["best_learned_speedup"] > 0
        fixed = table[(table["batch_size"] == batch_size) & (table["schedule"] == "fixed")][column].max()
        assert row["best_fixed_speedup"] == pytest.approx(fixed)
        assert row["captured"] == pytest.approx((row["best_scheduled_speedup"] - fixed)
                                                / (row["oracle_speedup"] - fixed))
    assert "headroom (predicted)" in result.output
    # Better signals: per signal, B and layout, the verdict itself reaching per-row perfect stopping at B > 1.
    better = pd.DataFrame(analysis["signal_headroom"])
    assert set(zip(better["batch_size"], better["layout"])) == set(bound)
    for (batch_size, layout), group in better.groupby(["batch_size", "layout"]):  # the headroom's own oracle
        assert np.allclose(group["oracle_speedup"], bound[(batch_size, layout)]["oracle_speedup"], rtol=1e-12)
    assert better.groupby("signal", sort=False)["auc"].first().is_monotonic_increasing
    verdict = better[(better["signal"] == "verdict") & (better["batch_size"] == 2)]
    assert np.allclose(verdict["oracle_speedup"], verdict["best_rule_speedup"], rtol=1e-12)
    assert "better signals (predicted)" in result.output
    report = build_report(folder)
    assert "plots/batch_sizes.png" in figures_written(report) and "plots/signal_headroom.png" in figures_written(report)
    assert "### How good a signal would have to be" in report.read_text()
    text = report.read_text()
    check_under_load(folder, table, summary, result.output, text, figures_written(report))
    assert "## Batch sizes" in text and "predicted" in text and "at batch size 1" in text
    assert "| top1 |" in text and "Brier (fit)" in text  # the acceptance fit's quality, per metric
    assert "## Headroom" in text and "exact optimum" in text
    assert "| learned |" in text and "Held out by prompt" in text  # the reliability figure's signals table
    check_exports(folder, tmp_path)


def check_under_load(folder: Path, table: pd.DataFrame, summary: dict, output: str, report: str, figures) -> None:
    """The load stage of a sweep over B = 1, 2 at two arrival rates: every B = 2 policy of the draft
    model (the sweep's ids) and plain decoding at each rate, the best per rate by p50 TPOT,
    and the console, report and figure saying so."""
    load = pd.read_parquet(folder / "load.parquet")
    served = table[(table["batch_size"] == 2) & (table["drafter"] == "model")]
    assert set(load["config_id"]) == set(served["config_id"]) | {-1}
    assert len(load) == 2 * (len(served) + 1) and sorted(load["arrival_rate"].unique()) == [0.5, 50.0]
    assert (load["requests"] == 12).all() and (load["tpot_p99_s"] >= load["tpot_p50_s"]).all()
    labels = dict(zip(served["config_id"], served["config_label"]))
    for row in load[load["config_id"] >= 0].itertuples():  # the label names the policy, at the server's B
        assert row.config_label == labels[row.config_id]
    entry = summary["load"]
    assert entry["max_batch"] == 2 and entry["points"] == len(load) and entry["objective"] == "tpot_p50"
    # Priced inside running decodes by default: the terms a live batch of 2 rows paid past its passes.
    assert summary["prices"]["passes"] == "in decode" and summary["prices"]["step_terms"]["fitted_on"]["max_batch"] == 2
    assert "in_decode" in json.loads((folder / "cost_surface.json").read_text())
    for by_rate in entry["by_rate"]:
        here = load[(load["arrival_rate"] == by_rate["arrival_rate"]) & (load["config_id"] >= 0)]
        assert by_rate["best"]["tpot_p50_s"] == pytest.approx(here["tpot_p50_s"].min())
        assert by_rate["plain"]["config_label"] == "plain decoding"
    # Past saturation the server runs full; at 0.5 requests/s a 12-token request is served alone.
    light, heavy = (load[(load["arrival_rate"] == r) & (load["config_id"] < 0)].iloc[0] for r in (0.5, 50.0))
    assert heavy["throughput"] > light["throughput"] and heavy["ttft_p99_s"] > light["ttft_p99_s"]
    assert "under load (replayed, 12 requests per rate, up to 2 at once" in output and entry["verdict"] in output
    assert "## Under load" in report and "plots/under_load.png" in figures


def check_exports(folder: Path, tmp_path: Path) -> None:
    """Every format: written, parsed back to the policy chosen for it, the nearest one where the
    engine cannot express the tuned policy (and then both replayed speedups are shown)."""
    from dspark_bench.decoding.rules import expressible
    from dspark_bench.engines.export import FILES, FORMATS, choose, parse, run_policies

    run = run_policies(folder)
    for fmt in FORMATS:
        out = tmp_path / "exports" / fmt
        result = runner.invoke(app, ["export", str(folder), "--format", fmt, "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert f"what deploying on {fmt} costs" in result.output
        choices = choose(run, fmt)
        written = parse(fmt, (out / FILES[fmt]).read_text())
        assert "Targets:" in (out / f"{fmt}.md").read_text()  # the engine version it is written for
        assert sorted(written) == [c.batch_size for c in choices] == ([1, 2] if fmt in ("vllm", "trtllm") else [1])
        for c in choices:
            assert not expressible(c.exported, fmt)
            assert c.exported_speedup > 0 and c.tuned_speedup > 0
            gamma, threshold, minimum, semantics = written[c.batch_size]
            assert gamma == c.exported.stopping.gamma_max
            if fmt in ("hf", "llamacpp"):
                assert threshold == (0.0 if c.exported.stopping.schedule == "fixed" else c.exported.stopping.threshold)
                assert minimum == c.exported.stopping.min_draft_len
    # A learned signal fitted by an older version fails the export only where a best policy reads it.
    signal_file = folder / "learned_signal.json"
    kept = signal_file.read_text()
    signal_file.write_text('{"features": ["top1", "entropy", "position_1"], "mean": [0, 0, 0], "scale": [1, 1, 1], '
                           '"coef": [0, 0, 0], "intercept": 0}')
    older = runner.invoke(app, ["export", str(folder), "--format", "hf", "--out", str(tmp_path / "older")])
    signal_file.write_text(kept)
    if any(config.stopping.metric == "learned" for config, _, _ in run.best.values()):
        assert older.exit_code != 0 and "fitted by an older version" in older.output
    else:
        assert older.exit_code == 0, older.output
    bad = runner.invoke(app, ["export", str(folder), "--format", "onnx"])
    assert bad.exit_code != 0 and "unknown export format 'onnx'" in bad.output
    missing = runner.invoke(app, ["export", str(tmp_path / "nowhere"), "--format", "hf"])
    assert missing.exit_code != 0 and "is not a run folder" in missing.output


# --- resuming and several workers (real processes) ----------------------------------------------


def cli(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.Popen([sys.executable, "-m", "dspark_bench.cli", *args], env=env, text=True, **streams)


def slow_args(saved_pair, prompts_file, out, repeats: int = 2, tokens: int = 64) -> list[str]:
    args = base_args(saved_pair, prompts_file, out)[1:]
    args[args.index("--max-new-tokens") + 1] = str(tokens)  # long enough trials to be killed inside one
    return args + ["--evaluation", "real", "--repeats", str(repeats)]


def trial_states(db: Path) -> list[str]:
    """The trials' states, read without writing: Optuna's `load_study` creates the schema when it finds
    none, and doing that while the worker is creating it fails one of the two ("table alembic_version
    already exists"), so a poll during start-up must only read."""
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            return [row[0] for row in con.execute("SELECT state FROM trials")]
    except sqlite3.OperationalError:  # the worker has not created the tables yet
        return []


def test_resume_after_sigkill_finishes_the_grid_without_duplicates(saved_pair, prompts_file, tmp_path):
    worker = cli("sweep", *slow_args(saved_pair, prompts_file, tmp_path))
    deadline = time.time() + 120
    folder = None
    while time.time() < deadline:
        time.sleep(0.5)
        folders = [p for p in tmp_path.iterdir() if (p / "study.db").exists()]
        if folders:
            folder = folders[0]
            states = trial_states(folder / "study.db")
            if "COMPLETE" in states and "RUNNING" in states:
                break
    assert folder is not None
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    killed = [t for t in load_study(folder).get_trials() if t.state.name == "RUNNING"]
    assert len(killed) == 1
    resumed = runner.invoke(app, ["sweep", "--resume", str(folder)])
    assert resumed.exit_code == 0, resumed.output
    study = load_study(folder)
    assert sorted(grid_points(study)) == [(0.2, 2), (0.2, 4), (0.6, 2), (0.6, 4)]  # each exactly once
    states = [t.state.name for t in study.get_trials()]
    assert states.count("FAIL") == 1 and states.count("RUNNING") == 0
    assert (folder / "summary.json").is_file()


def test_resume_recovers_trials_of_dead_workers_named_or_not(tmp_path, monkeypatch):
    monkeypatch.setattr(studies, "UNNAMED_GRACE_S", 1.0)
    storage = studies.open_storage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_s=30)
    study = optuna.create_study(storage=storage)
    space = {"x": optuna.distributions.FloatDistribution(0, 1)}
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
    dead_name = f"{studies.socket.gethostname()}:{dead_pid}"
    named_dead = study.ask(space)
    named_dead.set_user_attr("worker", dead_name)
    named_dead.set_user_attr("worker_trial", named_dead.number)
    unnamed = study.ask(space)  # its worker was killed before naming itself
    inherited = study.ask(space)  # a retried trial carries its dead predecessor's name
    inherited.set_user_attr("worker", dead_name)
    inherited.set_user_attr("worker_trial", named_dead.number)
    alive = study.ask(space)
    studies.name_worker(alive)
    late = study.ask(space)  # a live worker that names itself during the grace period
    threading.Timer(0.2, studies.name_worker, args=(late,)).start()
    assert studies.recover_dead_trials(study) == 3
    trials = study.get_trials()
    states = {t.number: t.state.name for t in trials}
    assert [states[t.number] for t in (named_dead, unnamed, inherited)] == ["FAIL"] * 3
    assert states[alive.number] == states[late.number] == "RUNNING"
    retried = [t for t in trials if t.state.name == "WAITING"]
    assert sorted(t.system_attrs["failed_trial"] for t in retried) == [named_dead.number, unnamed.number,
                                                                       inherited.number]


def postgres_url() -> str:
    url = os.environ.get("DSPARK_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("no PostgreSQL server: set DSPARK_TEST_POSTGRES_URL (.ci/run starts one)")
    return url


def test_load_keeps_each_shared_trial_in_its_latest_state(tmp_path):
    # The worker that finishes first writes the other's last trial as still RUNNING.
    folders = []
    for name, states in (("first-done", ["COMPLETE", "RUNNING"]), ("last-done", ["COMPLETE", "COMPLETE"])):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps({"run_id": name, "kind": "sweep", "study": "shared"}))
        pd.DataFrame({"trial": [0, 1], "state": states}).to_parquet(folder / "trials.parquet")
        folders.append(folder)
    for order in (folders, folders[::-1]):
        merged = load(order)
        assert sorted(zip(merged["trial"], merged["state"])) == [(0, "COMPLETE"), (1, "COMPLETE")]


def decoding_workers(storage, study_name: str | None) -> set[str]:
    """The workers decoding a trial of the study: RUNNING, named for this very trial (a retried one
    inherits its predecessor's name), its policy set (the objective's last write before it decodes,
    so a worker paused then holds no storage lock: SQLite's would stop every other worker). None
    while the study is not made yet."""
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except Exception:  # noqa: BLE001 (no tables or study yet, or a locked file: poll again)
        return set()
    return {t.user_attrs["worker"] for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if t.user_attrs.get("worker_trial") == t.number and "config_label" in t.user_attrs}


def reading(url: str):
    """The storage at `url` opened without creating its schema (a worker may be creating it); None
    until its tables exist."""
    try:
        return optuna.storages.RDBStorage(url, skip_table_creation=True)
    except Exception:  # noqa: BLE001 (no tables yet: poll again)
        return None


def hold_first_until_second_joins(processes: list, storage_url, study_name: str | None = None,
                                  limit_s: float = 45) -> None:
    """Pause whichever worker takes a grid point first until another has taken one too.

    Left alone, one worker can take all four points while the other is still starting (CI saw it),
    and the test would say nothing about sharing. Paused, its heartbeat stops too: the pause stays
    under the heartbeat's grace period (2 x 30 s), so its trial is not retried meanwhile.
    `storage_url` is called until it names the storage (a sweep's own folder appears when it starts),
    which is then opened once (`reading`).
    """
    deadline, paused, storage = time.time() + limit_s, None, None
    try:
        while time.time() < deadline:
            if any(p.poll() is not None for p in processes):
                return  # exited early: the return codes and the trials below say how
            url = storage_url() if storage is None else None
            storage = storage or (reading(url) if url else None)
            running = decoding_workers(storage, study_name) if storage is not None else set()
            if paused is None and running:
                paused = next(iter(running))
                os.kill(int(paused.rsplit(":", 1)[1]), signal.SIGSTOP)
            elif paused is not None and running - {paused}:
                return
            time.sleep(0.2)
        pytest.fail("no second worker took a grid point while the first was paused")
    finally:
        if paused is not None:
            os.kill(int(paused.rsplit(":", 1)[1]), signal.SIGCONT)
        if storage is not None:
            storage.engine.dispose()


@contextmanager
def killed_at_exit(processes: list):
    """Worker processes (each its own session: a main worker's helpers with it) killed if still alive
    when the test leaves, failed or not."""
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def sweep_storage(out: Path) -> str | None:
    """The SQLite storage of the one sweep writing under `out`, once its folder has one."""
    found = sorted(out.glob("*/study.db"))
    return studies.default_storage(found[0].parent) if found else None


@pytest.mark.parametrize("storage", ["postgresql", "local-workers"])
def test_two_workers_share_one_grid_study(storage, saved_pair, prompts_file, tmp_path):
    # Trials of several seconds each, and the first worker to take a grid point paused until another
    # has taken one: the grid must still have points left when the second one joins.
    args = slow_args(saved_pair, prompts_file, tmp_path, repeats=3, tokens=128)
    logs = [tmp_path.parent / f"{tmp_path.name}-worker-{i}.log" for i in range(2)]
    if storage == "postgresql":
        url, study_name = postgres_url(), f"test-{uuid.uuid4().hex[:8]}"
        args += ["--storage", url, "--study", study_name]
        workers = [cli("sweep", *args, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
                   for log in logs]
        with killed_at_exit(workers):
            hold_first_until_second_joins(workers, lambda: url, study_name)
            for worker in workers:
                worker.wait(timeout=600)
        assert all(w.returncode == 0 for w in workers), [log.read_text()[-2000:] for log in logs]
        study = optuna.load_study(study_name=study_name, storage=url)
        folders = [p for p in tmp_path.iterdir() if p.name != "records"]
        assert len(folders) == 2
        merged = load(folders)
        assert len(merged[merged["state"] == "COMPLETE"]) == 4  # one row per trial across both folders
    else:
        main = cli("sweep", *args, "--workers", "2", stdout=logs[0].open("w"), stderr=subprocess.STDOUT,
                   start_new_session=True)
        with killed_at_exit([main]):
            hold_first_until_second_joins([main], lambda: sweep_storage(tmp_path))
            main.wait(timeout=600)  # the main worker waits for its helper before it writes the table
        assert main.returncode == 0, logs[0].read_text()[-2000:]
        study = load_study(only_folder(tmp_path))
        table = load(only_folder(tmp_path))  # written after the helper finished its last trial
        assert (table["state"] == "COMPLETE").sum() == 4
    workers_seen = {t.user_attrs["worker"] for t in study.get_trials(states=(COMPLETE,))}
    assert sorted(grid_points(study)) == [(0.2, 2), (0.2, 4), (0.6, 2), (0.6, 4)]
    # Nothing lost, nothing run twice: a worker that asks for a point after the grid is all
    # taken gets a trial that is pruned before it decodes anything.
    extra = [t for t in study.get_trials() if t.state != COMPLETE]
    assert all(t.state.name == "PRUNED" and t.user_attrs.get("skipped") == "grid point taken" for t in extra)
    assert len(workers_seen) == 2


def test_numeric_ranges_are_suggested_in_order():
    # TPE must know that 0.3 lies between 0.2 and 0.4: evenly spaced numbers are ordered ints or
    # floats with their step; uneven lists and names stay categorical.
    spec = spec_files.load_spec(None, {"task": "code", "evaluation": "real", "method": "optuna",
                                       "space.threshold": {"low": 0.2, "high": 0.6, "step": 0.1},
                                       "space.gamma_max": [2, 4, 6], "space.min_draft_len": [0, 1, 3],
                                       "space.metric": ["top1", "margin"]})
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    for _ in range(6):
        trial = study.ask()
        params = studies.suggest(trial, spec)
        assert params["threshold"] in spec.space["threshold"] and params["gamma_max"] in (2, 4, 6)
        study.tell(trial, 1.0)
    dists = study.trials[0].distributions
    assert dists["threshold"] == optuna.distributions.FloatDistribution(0.2, 0.6, step=0.1)
    assert dists["gamma_max"] == optuna.distributions.IntDistribution(2, 6, step=2)
    assert isinstance(dists["min_draft_len"], optuna.distributions.CategoricalDistribution)  # 0, 1, 3: uneven
    assert isinstance(dists["metric"], optuna.distributions.CategoricalDistribution)


def test_sweep_takes_the_same_prompt_flags_as_run(prompts_file):
    overrides = spec_files.command_overrides({"dataset": str(prompts_file), "prompt_field": "prompt",
                                              "category_field": "category", "split": "train"}, ["limit=2"])
    spec = spec_files.load_spec(None, overrides)
    assert (spec.dataset, spec.task, spec.prompt_field, spec.category_field, spec.limit) == \
        (str(prompts_file), None, "prompt", "category", 2)
    # The --prompts alias is gone (pre-1.0): a spec naming it is refused in one line, not read as dataset.
    with pytest.raises(DsparkError, match="unknown key"):
        spec_files.load_spec(None, spec_files.command_overrides({"prompts": "a.jsonl"}, []))


def test_recovering_the_last_grid_point_still_retries_it(tmp_path):
    # Failing the grid's last open point makes GridSampler stop the study, which raises outside
    # optimize(); the dead trial must still be queued again, or the grid would end without it.
    storage = studies.open_storage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_s=30)
    study = optuna.create_study(storage=storage, sampler=optuna.samplers.GridSampler({"x": [0.1, 0.2]}))
    done = study.ask()
    done.suggest_float("x", 0.1, 0.2)
    study.tell(done, 1.0)
    dead = study.ask()
    dead.suggest_float("x", 0.1, 0.2)
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
    dead.set_user_attr("worker", f"{studies.socket.gethostname()}:{dead_pid}")
    dead.set_user_attr("worker_trial", dead.number)
    assert studies.recover_dead_trials(study) == 1
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "FAIL", "WAITING"]
    table = studies.trials_table(study.get_trials())
    assert "retried" in table.loc[table["trial"] == dead.number, "error"].iloc[0]


@pytest.mark.parametrize("space", [
    {"threshold": [0.2, 0.6], "gamma_max": [2, 4], "metric": ["top1", "entropy"]},
    {"schedule": ["fixed"], "gamma_max": [3, 5]},
    {"drafter": ["lookup", "model"], "threshold": [0.3], "gamma_max": [4], "batch_size": [1, 2, 4]},
    {"drafter": ["heads"], "threshold": [0.3, 0.5], "gamma_max": [4]},
    {"schedule": ["threshold", "cumulative"], "metric": ["margin"], "gamma_max": [2, 6], "batch_size": [2]},
])
def test_the_plans_count_is_what_joins_after_recording(space, tmp_path):
    """replayed_count counts goodput, budget and learned from the space's axes, without building
    them; it must be what join_fitted adds once the fits exist."""
    from dspark_bench.config import DEFAULTS, expand
    from dspark_bench.tuning.added_policies import budget_points, goodput_points, learned_points
    from dspark_bench.tuning.replay_sweep import replay_space
    from dspark_bench.tuning.sweep_plan import replayed_count

    configs = replay_space(expand(space, DEFAULTS, strict=False), DEFAULTS)
    fitted = goodput_points(configs, tmp_path / "g.json") + budget_points(configs, tmp_path / "g.json")
    joined = configs + [c for c in fitted if c not in configs]
    joined += [c for c in learned_points(joined, tmp_path / "l.json") if c not in joined]
    assert replayed_count(configs) == len(joined) > len(configs) * (space.get("drafter") != ["heads"])


def test_a_sweep_at_a_temperature_replays_its_sampled_record(saved_pair, prompts_file, tmp_path):
    """Sampled traffic: K paths per prompt recorded once, every policy replayed with an interval,
    the best confirmed by real sampled runs; the record is refused for another temperature."""
    args = base_args(saved_pair, prompts_file, tmp_path) + ["--temperature", "1.0", "--top-p", "0.9",
                                                            "--confirm-top", "1", "--paths", "3"]
    # Too few paths for an interval: refused in one line, before any work.
    refused = runner.invoke(app, args + ["--paths", "1"])
    assert refused.exit_code != 0 and "paths must be at least 2 (got 1)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "records").exists()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "× 3 sampled paths" in text and "sampled at temperature 1, top-p 0.9 (3 paths × 4 coin draws" in text
    folder = only_folder(tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    precision = summary["sampling"].pop("precision")
    assert summary["sampling"] == {"temperature": 1.0, "top_p": 0.9, "seed": 0, "paths": 3, "draws": 4}
    table = pd.read_parquet(folder / "trials.parquet")
    # The grid, two fixed γ, goodput and budget at each γ: no learned signal from a sampled record.
    assert len(table) == 4 + 2 + 2 + 2 and not (table["metric"] == "learned").any()
    assert (table["replicates"] == 3).all()
    assert ((table["tokens_per_round_low"] <= table["tokens_per_round"])
            & (table["tokens_per_round"] <= table["tokens_per_round_high"])).all()
    # What the 3 paths bought: each metric's half-width, relative, the median over the replayed policies.
    replayed = table[table["source"] == "replay"]
    half = (replayed["tokens_per_round_high"] - replayed["tokens_per_round"]) / replayed["tokens_per_round"]
    assert precision["half_width"]["tokens_per_round"] == pytest.approx(half.median())
    assert set(precision["half_width"]) == {"predicted_speedup", "tokens_per_round", "acceptance_rate", "avg_draft_len"}
    assert "95 % interval over 3 sampled paths per prompt" in text and "--paths K" in text
    # --confirm-top 1: the best policy and the best fixed γ beside it.
    assert (table["source"] == "confirmed").sum() == 2 and (table["temperature"] == 1.0).all()
    (record_dir,) = (tmp_path / "records").iterdir()
    assert record_dir.name.endswith("-t1-p0.9-s0-K3-r2")
    # The same sweep again reuses it; another top-p is another record.
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and len(list((tmp_path / "records").iterdir())) == 1
    # The heads at a temperature: refused before models load.
    refused = runner.invoke(app, args + ["--drafter", "heads"])
    assert refused.exit_code == 1 and "not the heads" in refused.stderr, refused.output
    # Beside a greedy sweep of the same prompts, the report draws the temperature axis.
    from dspark_bench.reporting.report import build_report, figures_written
    from dspark_bench.reporting.report_inputs import load_inputs
    from dspark_bench.reporting.temperatures import temperature_rows

    assert runner.invoke(app, base_args(saved_pair, prompts_file, tmp_path) + ["--confirm-top", "1"]).exit_code == 0
    greedy = max(p for p in tmp_path.iterdir() if p.name != "records")  # the newest folder
    folders = [folder, greedy]
    rows = temperature_rows(load_inputs(folders)).set_index("temperature")
    assert sorted(rows.index) == [0.0, 1.0]
    greedy_best = rows.loc[0.0]
    assert rows.loc[1.0, "greedy_tuned"] == greedy_best["portable"]
    # The greedy-tuned policy replayed at T = 1 where the sampled sweep's space holds it.
    assert rows.loc[1.0, "greedy_tuned_speedup"] > 0
    assert "plots/temperatures.png" in figures_written(build_report(folders, tmp_path / "report"))


def test_a_spec_listing_temperatures_sweeps_each(saved_pair, prompts_file, tmp_path):
    """`temperatures`: one sweep per temperature, each its own record and folder, checked first."""
    args = base_args(saved_pair, prompts_file, tmp_path) + ["--confirm-top", "0", "--set", "temperatures=[0, 0.8]"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    folders = [p for p in tmp_path.iterdir() if p.name != "records"]
    # Sorted by temperature, not by folder name: two sweeps in one second are named in random order
    # (results.py: the second, then a random suffix).
    temperatures = sorted(json.loads((f / "run.json").read_text())["spec"]["temperature"] for f in folders)
    assert temperatures == [0.0, 0.8] and len(list((tmp_path / "records").iterdir())) == 2
    assert "the best policy against temperature: dspark-bench report" in " ".join(result.output.split())
    # A temperature a sampled record cannot serve is refused before the first sweep decodes.
    refused = runner.invoke(app, args + ["--drafter", "heads", "--out", str(tmp_path / "again")])
    assert refused.exit_code == 1 and "not the heads" in refused.stderr and not (tmp_path / "again").exists()
