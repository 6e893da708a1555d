"""Prices timed inside running decodes (harness/in_decode.py), what a sweep and a load run price with
by default, and `run --arrival-rate` (harness/served_run.py): the step terms priced as declared, fitted
back from steps that pay them, timed on a real pair, and a run under load served beside replay."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from cli_helpers import invoke, one_error_line
from test_batched import PROMPTS, SURFACE
from test_learned import learned_record  # noqa: F401 (a fixture)

from dspark_bench.config import DecodeConfig
from dspark_bench.harness.in_decode import calibration_policies, fit_terms, price_in_decode, ramp, turn_seconds
from dspark_bench.harness.under_load import step_costs
from dspark_bench.measure.cost_model import measure_surface
from dspark_bench.measure.recording import record
from dspark_bench.replay.batched import simulate_with_surface, walks
from dspark_bench.replay.cost import CostModel, CostSurface, StepTerms
from dspark_bench.replay.simulate import simulate_grid

# Per row count 0-8: a speculative step's seconds past its passes, a plain one's (each on a line over
# the rows, as they are fitted: harness/in_decode.line_over_rows); a join's, and its splice per position
# of the batch's caches (replay/slots.spliced).
TERMS = StepTerms(rows=[0.002 + 0.0005 * r for r in range(9)], plain_rows=[-0.0004 + 0.0003 * r for r in range(9)],
                  join=0.004, join_slots=2e-6)


def traced_steps() -> pd.DataFrame:
    """A plain and a speculative server's admissions and steps at every row count 1-8."""
    rows = []
    for config_id in (-1, 0):
        for r in range(1, 9):
            rows.append({"config_id": config_id, "learned": False, "kind": "join", "rows": r, "tokens": 5 + r,
                         "depth": 40 * r if config_id < 0 else 12, "forwards": np.nan, "longest": np.nan})
            for longest in (0, 2, 3):
                rows.append({"config_id": config_id, "learned": False, "kind": "step", "rows": r, "tokens": np.nan,
                             "forwards": 0 if config_id < 0 else longest, "longest": 0 if config_id < 0 else longest})
    return pd.DataFrame(rows)


def test_step_terms_are_charged_per_step_row_and_join():
    with_terms = dataclasses.replace(SURFACE, terms=TERMS)
    draft, verify = SURFACE.tables(8)
    _, charged = with_terms.tables(8)
    _, plain = with_terms.tables(8, plain=True)
    for r in range(1, 9):
        np.testing.assert_allclose(charged[r] - verify[r], TERMS.rows[r])
        np.testing.assert_allclose(plain[r] - verify[r], TERMS.plain_rows[r])  # below 0 at 2 rows too
    np.testing.assert_allclose(with_terms.tables(8)[0], draft)  # a draft pass is a pass: no terms on it
    steps = traced_steps()
    extra = step_costs(steps, with_terms) - step_costs(steps, SURFACE)
    rows = steps["rows"].to_numpy()
    per_step = np.where(steps["config_id"] < 0, np.take(TERMS.plain_rows, rows), np.take(TERMS.rows, rows))
    # A join: the term, and the splice of every row already there at the widest's context or its own prompt.
    positions = steps["rows"] * np.maximum(steps["depth"].fillna(0), steps["tokens"].fillna(0))
    expected = np.where(steps["kind"] == "join", 0.004 + 2e-6 * positions, per_step)
    np.testing.assert_allclose(extra, expected)
    assert CostSurface.from_dict(json.loads(json.dumps(with_terms.to_dict()))) == with_terms
    assert "in_decode" not in SURFACE.to_dict()  # isolated prices are written as they always were


def test_fitted_terms_are_the_ones_the_steps_paid():
    steps = traced_steps()
    paid = dataclasses.replace(SURFACE, terms=TERMS)
    fitted = fit_terms(steps.assign(seconds=step_costs(steps, paid)), SURFACE, {"requests": 8})
    for name in ("rows", "plain_rows", "join", "join_slots"):
        assert getattr(fitted, name) == pytest.approx(getattr(TERMS, name), abs=1e-12), name
    # Joins all spliced alike tell no slope apart: their median, as before the splice was priced.
    alike = steps.assign(depth=np.where(steps["kind"] == "join", 0, steps["depth"]), tokens=5, rows=1)
    flat = fit_terms(alike.assign(seconds=step_costs(alike, paid)), SURFACE, {})
    assert flat.join_slots == 0.0 and flat.join == pytest.approx(0.004 + 2e-6 * 5)
    assert fitted.fitted_on["steps"] == 48 and fitted.fitted_on["joins"] == 16
    assert fitted.fitted_on["steps_by_rows"]["speculative"] == {r: 3 for r in range(1, 9)}
    # A row count no step had lies on the line.
    narrow = steps[steps["rows"] != 5]
    assert fit_terms(narrow.assign(seconds=step_costs(narrow, paid)), SURFACE, {}).rows[5] == pytest.approx(
        TERMS.rows[5])


def test_a_draft_pass_term_is_told_apart_from_the_rows_line():
    """Steps that paid a draft pass's term on each draft pass (warm passes after the first cost less
    than the surface's, timed after a target pass) give it back apart from the line over rows, and
    the tables charge it on every draft pass of a speculative step."""
    warm = dataclasses.replace(TERMS, draft=-0.0005)
    paid = dataclasses.replace(SURFACE, terms=warm)
    steps = traced_steps()
    fitted = fit_terms(steps.assign(seconds=step_costs(steps, paid)), SURFACE, {})
    assert fitted.draft == pytest.approx(-0.0005, abs=1e-12)
    assert fitted.rows == pytest.approx(TERMS.rows, abs=1e-12) and fitted.plain_rows == pytest.approx(
        TERMS.plain_rows, abs=1e-12)
    np.testing.assert_allclose(paid.tables(8)[0], np.maximum(SURFACE.tables(8)[0] - 0.0005, 0.0))
    one_length = steps[steps["forwards"].isin([0, 3]) | (steps["config_id"] < 0)]  # two lengths: still told apart
    assert fit_terms(one_length.assign(seconds=step_costs(one_length, paid)), SURFACE, {}).draft == pytest.approx(
        -0.0005, abs=1e-12)
    same = steps[(steps["forwards"] == 3) | (steps["config_id"] < 0) | (steps["kind"] == "join")]
    assert fit_terms(same.assign(seconds=step_costs(same, paid)), SURFACE, {}).draft == 0.0  # nothing to tell apart
    assert CostSurface.from_dict(json.loads(json.dumps(paid.to_dict()))) == paid


def test_at_depth_a_round_pays_its_first_draft_pass_once():
    """With a depth axis a draft step is priced at its depth's isolated later step (measure_cost's
    chain line) and the first step's excess stays once a round of the draft model's (t_first_draft),
    as without one: not in t_round, which the heads and the lookup pay too."""
    from dspark_bench.harness import in_decode

    timed = CostModel(t_draft=0.001, t_verify=[0.01, 0.011], context_tokens=8, t_round=0.0008, t_first_draft=0.0005)
    monkeypatch_detail = {"first_draft_excess": 0.0005}
    flat = CostModel(t_draft=0.0015, t_verify=[0.01, 0.011], context_tokens=8)
    deep = dataclasses.replace(flat, by_depth={1024: {"t_draft": 0.0016, "t_verify": [0.012, 0.013]}})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(in_decode, "measure_in_decode", lambda *a, **k: (timed, monkeypatch_detail))
        alone = in_decode.batch_one(None, [[1]], [], flat, frozenset())[0]
        at_depth = in_decode.batch_one(None, [[1]], [], deep, frozenset())[0]
    assert (alone.t_round, alone.t_first_draft) == (0.0008, 0.0005) == (at_depth.t_round, at_depth.t_first_draft)
    draft, rounds = at_depth.at_depths([1024])
    assert draft[0] == pytest.approx(0.0016) and rounds[0, 1] == pytest.approx(0.013 + 0.0008 + 0.0005)
    assert at_depth.at_depths([1024], "heads")[1][0, 1] == pytest.approx(0.013 + 0.0008)


def test_a_few_slow_steps_at_one_width_move_the_terms_little():
    """A width seen a few times (a ramp passes a wide batch's counts once) with one step slowed by
    something else, and more steps at the others: the median per count and the weighted line keep
    every count's term within a fraction of a millisecond, where a mean per count took the slow
    step's 90 ms whole."""
    steps = pd.concat([traced_steps()] + [traced_steps()[lambda t: t["rows"] != 7]] * 3, ignore_index=True)
    seconds = step_costs(steps, dataclasses.replace(SURFACE, terms=TERMS))
    slow = steps.index[(steps["rows"] == 7) & (steps["kind"] == "step") & (steps["config_id"] == 0)][0]
    seconds[slow] += 0.09
    fitted = fit_terms(steps.assign(seconds=seconds), SURFACE, {})
    np.testing.assert_allclose(fitted.rows, TERMS.rows, atol=2e-4)
    np.testing.assert_allclose(fitted.plain_rows, TERMS.plain_rows, atol=1e-12)


def test_a_kind_seen_at_one_width_is_flat_at_its_median():
    steps = traced_steps()[lambda t: t["rows"] == 4]
    fitted = fit_terms(steps.assign(seconds=step_costs(steps, SURFACE) + 0.003), SURFACE, {})
    assert fitted.plain_rows == pytest.approx([0.003] * 5) and fitted.rows == pytest.approx([0.003] * 5)


def test_a_join_s_term_is_paid_once_per_request_in_the_load_replay(llama_pair):
    """Every request waiting at the start of a 1-row server: each joins once, so plain decoding's
    predicted time grows by the join term times the requests, and by its own step term per step."""
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    rec = record(pair, PROMPTS, 6, 3, topk=5, eos_ids=frozenset())
    config = [DecodeConfig.of(schedule="fixed", gamma_max=3, max_new_tokens=6, batch_size=1)]

    def baseline(surface):
        return next(row for row in walks(rec, config, surface, True, np.zeros(len(PROMPTS)), lambda f, e: {})
                    if row["config_id"] == -1)["predicted_time"]

    joins = StepTerms([0.0] * 2, [0.0] * 2, join=0.01)
    assert baseline(dataclasses.replace(SURFACE, terms=joins)) - baseline(SURFACE) == pytest.approx(0.01 * len(PROMPTS))
    upkeep = StepTerms([0.5] * 2, [0.001] * 2, join=0.0)  # the speculative term is not plain's
    steps = int(rec.lengths.sum())  # a step a token: the prefill's logits are the first step's
    assert baseline(dataclasses.replace(SURFACE, terms=upkeep)) - baseline(SURFACE) == pytest.approx(0.001 * steps)


def test_a_batch_one_policy_is_priced_on_the_batch_one_decoder_s_prices(llama_pair):
    """Priced inside decodes, a sweep over B prices its batch-1 policies as the batch-1 decoder that
    runs them (simulate_grid on its in-decode model: t_round, t_plain), not as a one-row live batch
    paying the step terms; its batched policies are untouched."""
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    rec = record(pair, PROMPTS, 6, 3, topk=5, eos_ids=frozenset())
    configs = [DecodeConfig.of(schedule="fixed", gamma_max=g, max_new_tokens=6, batch_size=b)
               for b in (1, 8) for g in (2, 3)] + [DecodeConfig.of(threshold=0.5, gamma_max=3, max_new_tokens=6)]
    timed = dataclasses.replace(SURFACE.at(1), t_round=0.004, t_plain=0.012)
    surface = dataclasses.replace(SURFACE, terms=dataclasses.replace(TERMS, rows=[0.05] * 9))
    walked, priced = simulate_with_surface(rec, configs, surface), simulate_with_surface(rec, configs, surface,
                                                                                         batch_one=timed)
    alone = simulate_grid(rec, [configs[i] for i in (0, 1, 4)], timed)
    for column in ("predicted_speedup", "predicted_speedup_packed"):
        np.testing.assert_allclose(priced.loc[[0, 1, 4], column], alone["predicted_speedup"])
    assert (walked.loc[[0, 1, 4], "predicted_speedup"] < 0.5 * alone["predicted_speedup"].to_numpy()).all()
    pd.testing.assert_frame_equal(priced.loc[[2, 3]], walked.loc[[2, 3]])


def test_a_ramp_fills_the_batch_a_row_at_a_time():
    arrivals = ramp(8, 4, 10, 0.02)
    np.testing.assert_allclose(np.diff(arrivals.times), 10 * 0.02 / 4)
    assert arrivals.requests == 8 and arrivals.times[0] == 0
    # The servers step in turns: a row frees at the turn's pace, each server's longest step at the full batch.
    policies = calibration_policies(DecodeConfig(), 5)
    full = SURFACE.at(max(SURFACE.models))
    assert [c.stopping.gamma_max for c in policies] == [4, 5]
    assert turn_seconds(SURFACE, policies) == pytest.approx(
        full.t_verify[0] + 4 * full.t_draft + full.t_verify[4] + 5 * full.t_draft + full.t_verify[5])


def test_prices_in_decode_on_a_real_pair(llama_pair):
    """Timed on a real (tiny) pair: the batch-1 model carries what decodes add past their passes,
    and the surface the terms fitted on a live batch of every row count."""
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, device=target.device, eos_ids=frozenset())
    rec = record(pair, PROMPTS, 8, 4, topk=5, eos_ids=frozenset())
    rows = [p + rec.continuation[i, :4].tolist() for i, p in enumerate(PROMPTS)]
    isolated = measure_surface(pair, rows[0], 4, [1, 2], repeats=2, contexts=rows)
    timed = price_in_decode(pair, PROMPTS, DecodeConfig.of(max_new_tokens=8), isolated, 4, frozenset())
    assert timed.cost.t_plain > 0 and timed.cost.t_round >= 0 and len(timed.cost.t_verify) == 5
    assert timed.detail["rounds"] > 0 and timed.detail["plain_steps"] > 0
    terms = timed.surface.terms
    assert terms is not None and terms.fitted_on["requests"] == 4 and terms.fitted_on["max_batch"] == 2
    assert terms.fitted_on["joins"] == 3 * 4  # plain decoding and two policies, each admitting every request
    assert sorted(timed.surface.models) == [1, 2] and timed.surface.at(1).t_prefill_target > 0
    described = timed.described()
    assert described["passes"] == "in decode" and described["step_terms"]["fitted_on"]["steps"] > 0
    # The traced steps kept are the ones the terms were fitted on: refitted, they give the same terms.
    assert (timed.steps["kind"] == "step").sum() == terms.fitted_on["steps"]
    assert fit_terms(timed.steps, isolated, terms.fitted_on) == terms


def test_a_run_under_load_sets_replay_beside_the_measurement(saved_pair, prompts_file, tmp_path):
    from dspark_bench.reporting.report import build_report

    target, draft = saved_pair
    result = invoke("run", "--target", target, "--draft", draft, "--dataset", str(prompts_file), "--max-new-tokens",
                    "8", "--batch-size", "2", "--schedule", "fixed", "--gamma-max", "2", "--gamma-max", "3",
                    "--arrival-rate", "40", "--requests", "6", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert "under load: measured · replay's prediction" in result.output
    assert "timing prices inside decodes" in result.output
    folder = next((tmp_path / "out").iterdir())
    table = pd.read_parquet(folder / "load.parquet")
    assert list(table["config_label"]) == ["plain decoding", "fixed γ=2 · B=2", "fixed γ=3 · B=2"]
    assert table["identical"].all()  # greedy: every request's output is plain decoding's
    for metric in ("throughput", "tpot_p50_s", "ttft_p50_s"):
        assert (table[metric] > 0).all() and (table[f"{metric}_replay"] > 0).all()
    requests = pd.read_parquet(folder / "requests.parquet")
    assert len(requests) == 3 * 6 and (requests["first_token_s"] >= requests["arrival_s"]).all()
    steps = pd.read_parquet(folder / "steps.parquet")  # every server's admissions and steps, as timed
    assert (steps.groupby("config_id")["kind"].apply(lambda k: (k == "join").sum()) == 6).all()
    assert sorted(steps["config_id"].unique()) == [-1, 0, 1] and (steps["seconds"] > 0).all()
    calibration = pd.read_parquet(folder / "calibration_steps.parquet")  # what the step terms were fitted on
    assert (calibration["kind"] == "step").sum() == json.loads((folder / "cost_surface.json").read_text())[
        "in_decode"]["fitted_on"]["steps"]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["load_run"]["prices"]["passes"] == "in decode" and summary["load_run"]["max_batch"] == 2
    assert "in_decode" in json.loads((folder / "cost_surface.json").read_text())
    report = build_report([folder], tmp_path / "report")
    assert "## Under load, measured" in report.read_text()
    # Its run.json, handed back to `run --config`, serves the same load again.
    again = invoke("run", "--config", str(folder / "run.json"), "--out", str(tmp_path / "again"))
    assert again.exit_code == 0, again.output
    served = pd.read_parquet(next((tmp_path / "again").iterdir()) / "load.parquet")
    assert list(served["config_label"]) == list(table["config_label"]) and served["identical"].all()


def test_a_one_row_server_under_load_is_priced_on_its_passes(saved_pair, prompts_file, tmp_path):
    """A server of one row has no live batch to fit step terms on, and replay walks its steps on
    their passes: it is priced on the passes timed alone, and says why (it had no surface at all)."""
    target, draft = saved_pair
    result = invoke("run", "--target", target, "--draft", draft, "--dataset", str(prompts_file), "--max-new-tokens",
                    "6", "--batch-size", "1", "--schedule", "fixed", "--gamma-max", "2", "--arrival-rate", "40",
                    "--requests", "3", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    folder = next((tmp_path / "out").iterdir())
    surface = json.loads((folder / "cost_surface.json").read_text())
    assert list(surface["batch_sizes"]) == ["1"] and "in_decode" not in surface
    prices = json.loads((folder / "summary.json").read_text())["load_run"]["prices"]
    assert prices == {"passes": "isolated", "why": "a server of one row has no live batch to fit step terms on"}
    assert not (folder / "calibration_steps.parquet").exists()
    assert (pd.read_parquet(folder / "load.parquet")["tpot_p50_s_replay"] > 0).all()


@pytest.mark.parametrize("flags, message", [
    (["--arrival-rate", "0"], "an arrival rate must be a number above 0 requests per second"),
    (["--arrival-rate", "1", "--arrival-rate", "1"], "--arrival-rate: give each rate once"),
    (["--arrival-trace", "no-such-trace.txt"], "cannot read the arrival trace no-such-trace.txt"),
    (["--arrival-rate", "1", "--temperature", "0.7"], "predicts greedy decoding"),
    (["--arrival-rate", "1", "--drafter", "lookup"], "drafts with the draft model"),
    (["--arrival-rate", "1", "--decoder", "hf"], "serves our batched decoder: drop --decoder"),
    (["--arrival-rate", "1", "--repeats", "3"], "serves each load once"),
    (["--arrival-rate", "1", "--requests", "0"], "requests must be at least 1 (got 0)"),
    (["--requests", "10"], "--requests has no effect here: it needs a load"),
    (["--isolated-prices"], "--isolated-prices has no effect here: it needs replay's prices"),
])
def test_a_bad_run_under_load_is_refused_in_one_line_before_any_work(tmp_path, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", "--task", "code", *flags, "--out", tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert message in one_error_line(result)
    assert not (tmp_path / "out").exists()


def test_isolated_prices_are_a_flag_away(saved_pair, prompts_file, tmp_path):
    """`sweep --isolated-prices`: the passes timed alone, said in the plan and the summary."""
    target, draft = saved_pair
    result = invoke("sweep", "--target", target, "--draft", draft, "--dataset", str(prompts_file), "--max-new-tokens",
                    "8", "--threshold", "0.3", "--gamma-max", "3", "--confirm-top", "0", "--isolated-prices",
                    "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "prices: our passes timed alone (--isolated-prices" in result.output
    folder = next(p for p in tmp_path.iterdir() if p.name != "records")
    assert json.loads((folder / "summary.json").read_text())["prices"]["passes"] == "isolated"


def test_a_run_under_load_replays_its_learned_policies_on_their_signal(learned_record):  # noqa: F811
    """The run's own record holds the learned signal its policies name (served_run.with_signals),
    as a sweep's record holds the signal it fitted: without it their replay has nothing to read."""
    from test_learned import learned_policies

    from dspark_bench.config import LEARNED
    from dspark_bench.errors import DsparkError
    from dspark_bench.harness.served_run import with_signals

    _, rec, path = learned_record
    bare = dataclasses.replace(rec, confidences={k: v for k, v in rec.confidences.items() if k != LEARNED})
    given = with_signals(bare, learned_policies(path))
    np.testing.assert_array_equal(given.confidences[LEARNED], rec.confidences[LEARNED])
    assert with_signals(bare, [DecodeConfig.of(threshold=0.4)]) is bare
    with pytest.raises(DsparkError, match="one learned signal"):
        with_signals(bare, [*learned_policies(path)[:1], DecodeConfig.of(metric="learned", signal_model="other.json")])
