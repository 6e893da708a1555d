"""`dspark-bench regress`: pass on an unchanged re-run, fail on a worse decoder, refuse bad baselines."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import tiny
from cli_helpers import folder_digest, invoke, one_error_line  # noqa: E402

from dspark_bench.errors import DsparkError
from dspark_bench.reporting import regress as lib

RUN_FLAGS = ("--threshold", "0.2", "--threshold", "0.6", "--gamma-max", "4", "--max-new-tokens", "12", "--repeats", "1")


def run_folders(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if not p.name.startswith(".")) if out.exists() else []


def benchmark(out: Path, target: str, draft: str, prompts: Path) -> Path:
    """`dspark-bench run` of the tiny benchmark; returns its run folder."""
    result = invoke("run", "--target", target, "--draft", draft, "--dataset", prompts, "--out", out, *RUN_FLAGS)
    assert result.exit_code == 0, result.output
    (folder,) = run_folders(out)
    return folder


@pytest.fixture(scope="module")
def baseline(saved_pair, prompts_file, tmp_path_factory) -> Path:
    """A run folder made by `dspark-bench run`: it is a baseline as it stands."""
    return benchmark(tmp_path_factory.mktemp("baseline"), *saved_pair, prompts_file)


@pytest.fixture
def worse_decoder(monkeypatch):
    # Never keep a drafted token: drafts are empty, so tokens_per_round drops to 1.
    monkeypatch.setattr("dspark_bench.decoding.proposal.keeps", lambda *args: False)
    monkeypatch.setattr("dspark_bench.decoding.proposal.forced", lambda config: 0)  # not even the first min_draft_len


def test_unchanged_rerun_passes(baseline, tmp_path):
    before = folder_digest(baseline)
    result = invoke("regress", "--baseline", baseline / "summary.json", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    assert "Verdict: PASS" in result.output
    for metric in (*lib.DETERMINISTIC_METRICS, "outputs_fingerprint", "speedup"):
        assert f"`{metric}`" in result.output
    assert "| fail |" not in result.output
    (rerun,) = run_folders(tmp_path)
    assert (rerun / "regress.md").read_text().strip() in result.output
    assert folder_digest(baseline) == before


def test_worse_decoder_fails(baseline, worse_decoder, tmp_path):
    report = tmp_path / "report.md"
    result = invoke("regress", "--baseline", baseline / "summary.json", "--out", tmp_path / "out", "--report", report)
    assert result.exit_code == 1, result.output
    text = report.read_text()
    assert "Verdict: FAIL" in text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "`" in line]
    tokens_per_round = [r for r in rows if r[1] == "`tokens_per_round`"]
    assert len(tokens_per_round) == 2 and all(r[-1] == "fail |" for r in tokens_per_round)
    assert all(float(r[3]) == 1.0 and float(r[2]) > 1.0 for r in tokens_per_round)
    # The target alone decides greedy output, so the generated ids are unchanged.
    assert all(r[-1] == "pass |" for r in rows if r[1] == "`outputs_fingerprint`")


def test_baseline_from_other_models_is_refused(baseline, saved_pair, prompts_file, tmp_path):
    other_target = tiny.llama(seed=1)
    target, draft = tiny.save_pair(tmp_path / "pair", other_target, tiny.noisy_copy(other_target, 0.03))
    other = benchmark(tmp_path / "other", target, draft, prompts_file)
    result = invoke("regress", "--baseline", other / "summary.json", "--current", baseline)
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "not comparable" in line and "target fingerprint" in line and "draft fingerprint" in line
    assert not (baseline / "regress.md").exists()


def test_rerun_refuses_before_decoding_when_models_changed(baseline, tmp_path):
    copy = tmp_path / "baseline"
    shutil.copytree(baseline, copy)
    info = json.loads((copy / "run.json").read_text())
    info["models"]["target_fingerprint"] = "0" * 16  # as if the weights at that path had changed
    (copy / "run.json").write_text(json.dumps(info))
    result = invoke("regress", "--baseline", copy / "summary.json", "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert "target fingerprint differs" in one_error_line(result)
    assert run_folders(tmp_path / "out") == []


def _missing(folder: Path) -> None:
    (folder / "summary.json").unlink()


def _corrupt(folder: Path) -> None:
    (folder / "summary.json").write_text('{"schema_version": 1, "configs": [')


def _wrong_schema(folder: Path) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "schema_version": 99}))


def _missing_key(folder: Path) -> None:
    info = json.loads((folder / "run.json").read_text())
    del info["prompts"]["fingerprint"]
    (folder / "run.json").write_text(json.dumps(info))


def _no_samples(folder: Path) -> None:
    (folder / "samples.parquet").unlink()


@pytest.mark.parametrize(
    "damage,message",
    [(_missing, "does not exist"), (_corrupt, "not valid JSON"), (_wrong_schema, "schema_version 99"),
     (_missing_key, "lacks prompts.fingerprint"), (_no_samples, "samples")],
)
def test_unusable_baseline_exits_2_and_touches_nothing(damage, message, baseline, tmp_path):
    copy = tmp_path / "baseline"
    shutil.copytree(baseline, copy)
    damage(copy)
    before = folder_digest(copy)
    result = invoke("regress", "--baseline", copy / "summary.json", "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert message in one_error_line(result)
    assert folder_digest(copy) == before
    assert run_folders(tmp_path / "out") == []


def test_a_broken_baseline_file_is_named_as_given(baseline, tmp_path):
    # A summary saved under another name: that file is read (and named), not summary.json beside it.
    copy = tmp_path / "baseline"
    shutil.copytree(baseline, copy)
    (copy / "broken.json").write_text('{"schema_version": 1, "configs": [')
    result = invoke("regress", "--baseline", copy / "broken.json", "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    line = one_error_line(result)
    assert "broken.json" in line and "not valid JSON" in line and "summary.json" not in line


def test_update_rewrites_the_baseline(baseline, saved_pair, prompts_file, tmp_path, monkeypatch):
    ci = tmp_path / "baselines" / "ci"
    # --force: the tiny models' sub-millisecond timings may well be judged noise; not the point here.
    created = invoke("regress", "--baseline", ci / "summary.json", "--current", baseline, "--update", "--force")
    assert created.exit_code == 0, created.output
    assert {p.name for p in ci.iterdir()} == {*lib.BASELINE_FILES, "baseline.json"}

    monkeypatch.setattr("dspark_bench.decoding.proposal.keeps", lambda *args: False)
    monkeypatch.setattr("dspark_bench.decoding.proposal.forced", lambda config: 0)  # not even the first min_draft_len
    worse = benchmark(tmp_path / "worse", *saved_pair, prompts_file)
    assert invoke("regress", "--baseline", ci / "summary.json", "--current", worse).exit_code == 1

    updated = invoke("regress", "--baseline", ci / "summary.json", "--current", worse, "--update", "--force")
    assert updated.exit_code == 0, updated.output
    assert (ci / "summary.json").read_bytes() == (worse / "summary.json").read_bytes()
    assert [p.name for p in ci.parent.iterdir()] == ["ci"]  # no temporary folders left behind
    # A following regress (a fresh re-run of the updated baseline) passes.
    again = invoke("regress", "--baseline", ci / "summary.json", "--out", tmp_path / "out")
    assert again.exit_code == 0, again.output


def test_update_without_intent_refuses_to_overwrite(baseline, tmp_path):
    target = lib.update_baseline(baseline, tmp_path / "ci")
    before = folder_digest(target)
    with pytest.raises(DsparkError, match="already exists"):
        lib.update_baseline(baseline, target)
    assert folder_digest(target) == before


def test_comparable_names_every_difference(baseline):
    old = json.loads((baseline / "run.json").read_text())
    new = json.loads(json.dumps(old))
    assert lib.comparable(old, new) == []
    new["models"].update(draft_fingerprint="x", dtype="bfloat16", device="cuda:0")
    new["prompts"]["fingerprint"] = "y"
    new["configs"][0].update(max_new_tokens=99, temperature=0.7, threshold=0.3)
    new["settings"]["turns"] = "all"
    new["capture"]["mode"] = "cuda-graphs"
    reasons = " | ".join(lib.comparable(old, new))
    for what in ("draft fingerprint", "dtype", "device type", "prompts fingerprint", "max_new_tokens",
                 "temperature", "config 0 differs (threshold 0.2 → 0.3)", "setting turns",
                 "capture mode differs (baseline 'eager', current 'cuda-graphs')"):
        assert what in reasons, what
    assert "target fingerprint" not in reasons
    del old["capture"]  # a run.json from before it said how its passes ran: they ran eagerly
    assert lib.comparable(old, json.loads((baseline / "run.json").read_text())) == []


def _with_speedup(record: lib.RunRecord, factor: float, timing: str | None = None) -> lib.RunRecord:
    """`record` with its speedups scaled, and its timing health as given (None: none recorded)."""
    rows = [{**row, "speedup": row["speedup"] * factor} for row in record.summary["configs"]]
    health = {"verdict": timing, "checks": [], "headline": f"timings {timing}: a reason"} if timing else None
    return lib.RunRecord(record.folder, record.run, {**record.summary, "configs": rows, "timing_health": health},
                         record.outputs)


def test_slower_speed_is_flagged_or_failed_when_strict(baseline):
    record = lib.load_baseline(baseline / "summary.json")
    slower = _with_speedup(record, 0.5)
    flagged = lib.compare(record, slower)
    assert not flagged.failed and flagged.flagged and "Verdict: PASS" in flagged.markdown()
    assert [r.verdict for r in flagged.rows if r.metric == "speedup"] == ["flag", "flag"]
    assert lib.compare(record, slower, strict_speed=True).failed
    assert not lib.compare(record, _with_speedup(record, 0.9)).flagged  # within the default 25 %
    assert not lib.compare(record, _with_speedup(record, 2.0)).flagged


def _on_machine(record: lib.RunRecord, **machine) -> lib.RunRecord:
    env = {**record.run["environment"], "machine": {**record.run["environment"]["machine"], **machine}}
    summary = {**record.summary, "timing_health": None}  # the tiny run's own timings are not the point here
    return lib.RunRecord(record.folder, {**record.run, "environment": env}, summary, record.outputs)


def test_noise_is_the_first_suspect_when_the_run_s_timings_failed(baseline):
    record = lib.load_baseline(baseline / "summary.json")
    noisy = lib.compare(record, _with_speedup(record, 0.5, timing="unreliable"))
    assert noisy.notes[0].startswith("first suspect: noise, not the code — the current run's timings unreliable")
    assert noisy.notes[1].startswith("same machine as the baseline")  # the code comes after
    calm = lib.compare(record, _with_speedup(record, 1.0, timing="noisy"))
    assert calm.notes[0].startswith("speed compared, but — the current run's timings noisy")
    assert not lib.compare(record, _with_speedup(record, 1.0, timing="ok")).notes[0].startswith(("first", "speed"))


def test_an_unreliable_run_does_not_become_the_baseline_unless_forced(baseline, tmp_path):
    busy = tmp_path / "busy"
    shutil.copytree(baseline, busy)
    summary = json.loads((busy / "summary.json").read_text())
    summary["timing_health"] = {"verdict": "unreliable", "checks": [], "headline": "timings unreliable: a reason"}
    (busy / "summary.json").write_text(json.dumps(summary))
    ci = tmp_path / "baselines" / "ci"
    refused = invoke("regress", "--baseline", ci / "summary.json", "--current", busy, "--update")
    assert refused.exit_code == 2 and "timings are unreliable" in one_error_line(refused) and not ci.exists()
    forced = invoke("regress", "--baseline", ci / "summary.json", "--current", busy, "--update", "--force")
    assert forced.exit_code == 0, forced.output
    assert json.loads((ci / "summary.json").read_text())["timing_health"]["verdict"] == "unreliable"


def test_a_machine_change_is_the_first_suspect_when_speed_moves(baseline):
    record = lib.load_baseline(baseline / "summary.json")
    assert record.run["environment"]["machine"]["cpu"]  # every run records its machine
    moved = lib.compare(record, _on_machine(_with_speedup(record, 0.5), cpu="Other CPU", cpu_cores=64))
    first = moved.markdown().split("\n- ")[1]
    assert first.startswith("first suspect: the machine changed (cpu, cpu_cores") and "Other CPU" in first
    same = lib.compare(record, _with_speedup(record, 0.5)).notes[0]
    assert same.startswith("same machine as the baseline")
    # A baseline from before machines were recorded: say so rather than guess.
    old = lib.RunRecord(record.folder, {**record.run, "environment": {}}, record.summary, record.outputs)
    assert "does not record its machine" in lib.compare(old, _with_speedup(record, 0.5)).notes[0]
    # Speed within tolerance: a different machine is mentioned, not blamed.
    calm = lib.compare(record, _on_machine(record, cpu="Other CPU")).notes[0]
    assert calm.startswith("the machine changed (cpu") and "speed compared anyway" in calm
    assert not lib.compare(record, record).notes[0].startswith(("same machine", "the machine"))


def test_metrics_compare_within_tolerance():
    assert lib.metric_row("c", "tokens_per_round", 2.0, 2.0 * (1 + 1e-9), 1e-6).verdict == "pass"
    assert lib.metric_row("c", "tokens_per_round", 2.0, 2.001, 1e-6).verdict == "fail"
    assert lib.metric_row("c", "acceptance_rate", math.nan, math.nan, 1e-6).verdict == "pass"
    assert lib.metric_row("c", "acceptance_rate", math.nan, 0.5, 1e-6).verdict == "fail"


def test_outputs_fingerprint_ignores_row_order(baseline):
    import pandas as pd

    samples = pd.read_parquet(baseline / "samples.parquet")
    assert lib.outputs_fingerprint(samples) == lib.outputs_fingerprint(samples.iloc[::-1])
    changed = samples.copy()
    ids = list(changed.at[0, "output_ids"])
    changed.at[0, "output_ids"] = ids[:-1] + [(ids[-1] + 1) % tiny.VOCAB]  # one token differs
    assert lib.outputs_fingerprint(changed) != lib.outputs_fingerprint(samples)


def test_bad_tolerance_and_help(baseline):
    result = invoke("regress", "--baseline", baseline / "summary.json", "--speed-tolerance", "1.5")
    assert result.exit_code == 2 and "--speed-tolerance" in one_error_line(result)
    help_text = invoke("regress", "--help")
    assert help_text.exit_code == 0 and "Example" in help_text.output


def test_regress_at_another_batch_size_compares_policy_metrics_and_outputs(baseline, tmp_path):
    result = invoke("regress", "--baseline", baseline / "summary.json", "--out", tmp_path, "--batch-size", "3")
    assert result.exit_code == 0, result.output
    assert "Verdict: PASS" in result.output and "· B=3" in result.output
    assert "`outputs_fingerprint`" in result.output and "| same | pass |" in result.output
    assert "B=3 against B=1: not compared | n/a |" in result.output  # another batch size's speed
    (rerun,) = run_folders(tmp_path)
    assert json.loads((rerun / "run.json").read_text())["config"]["grid"]["batch_size"] == [3]


def test_regress_at_another_batch_size_still_catches_a_worse_decoder(baseline, worse_decoder, tmp_path):
    result = invoke("regress", "--baseline", baseline / "summary.json", "--out", tmp_path, "--batch-size", "2")
    assert result.exit_code == 1 and "Verdict: FAIL" in result.output
    refused = invoke("regress", "--baseline", baseline / "summary.json", "--update", "--batch-size", "2")
    assert refused.exit_code == 2 and "drop --update" in one_error_line(refused)


def test_speed_is_compared_paired_per_prompt_where_both_runs_have_samples(baseline):
    import dataclasses

    record = lib.load_baseline(baseline / "summary.json")
    assert record.samples is not None and record.samples["prompt_id"].nunique() == 3
    # The summaries say nothing moved; the samples (the same prompts, each 1.6× slower) say it did.
    slower = dataclasses.replace(record, samples=record.samples.assign(spec_time_s=record.samples["spec_time_s"] * 1.6))
    rows = [r for r in lib.compare(record, slower).rows if r.metric == "speedup"]
    assert [r.verdict for r in rows] == ["flag", "flag"]
    assert all(r.change.startswith("×0.625 [") and r.change.endswith("paired over 3 prompts") for r in rows)
    unchanged = [r for r in lib.compare(record, record).rows if r.metric == "speedup"]
    assert all(r.verdict == "pass" and r.change.startswith("×1.000 [1.000, 1.000]") for r in unchanged)
