"""Depth at every batch size and under load (issue 67; docs/depth.md#at-every-batch-size-and-under-load):
a surface timed at depths at every B prices each batched step at its rows' depths (padded: the
widest row's; packed: their mean), a depth policy's rows each run their own bucket's policy in the
batched decoder and in batched replay, and replay under load walks depth policies."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import tiny

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.batched import batched_speculative
from dspark_bench.measure.recording import record
from dspark_bench.replay.batched import predict_batched
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.simulate import simulate, simulate_grid
from dspark_bench.replay.step_prices import draft_row, step_prices, surface_depths, verify_row
from dspark_bench.replay.under_load import poisson, replay_load

N, G = 24, 5
# Prompts on both sides of depth 256 and one short one (the tiny model reads any length).
PROMPTS = [[1 + i % 50 for i in range(n)] for n in (245, 300, 6)]
A_DRAFT, A_VERIFY = 2e-6, 1e-5  # seconds per context token: every price below is linear in depth


def linear(batch: int, depths=(256, 1024), prefill: bool = False) -> CostModel:
    """A cost model whose passes cost in proportion to their depth (and a little more per row and
    per verified token, so that cost_tables' monotone fill changes nothing)."""
    def verify(d):
        return [A_VERIFY * d * (1 + 0.1 * (batch - 1)) * (1 + 0.01 * k) for k in range(G + 1)]

    by_depth = {d: {"t_draft": A_DRAFT * d * batch, "t_verify": verify(d)} for d in depths}
    if prefill:
        for d in depths:
            by_depth[d].update(t_prefill_target=1e-4, t_prefill_draft=2e-5)
    return CostModel(A_DRAFT * 300, verify(300), 300, batch, by_depth=by_depth)


@pytest.fixture(scope="module")
def deep_record(llama_pair):
    target, draft = llama_pair
    return record(SimpleNamespace(target=target, draft=draft, eos_ids=frozenset()), PROMPTS, N, G, topk=5)


def policies() -> list[DecodeConfig]:
    return [DecodeConfig.of(threshold=t, gamma_max=g, max_new_tokens=N) for t in (0.0, 0.3, 0.7) for g in (2, G)]


def test_a_surface_without_the_axis_at_every_batch_size_prices_as_before(deep_record):
    flat = CostSurface({b: dataclasses.replace(linear(b), by_depth={}) for b in (1, 3)})
    half = CostSurface({1: linear(1), 3: dataclasses.replace(linear(3), by_depth={})})  # only B = 1 at depth
    assert surface_depths(half) == () and surface_depths(CostSurface({1: linear(1), 3: linear(3)})) == (256, 1024)
    configs = [c.replace(batch_size=3) for c in policies()]
    before, now = predict_batched(deep_record, configs, flat), predict_batched(deep_record, configs, half)
    assert now["predicted_time"].tolist() == before["predicted_time"].tolist()  # to the bit
    assert now["predicted_time_packed"].tolist() == before["predicted_time_packed"].tolist()


def test_at_batch_one_the_walk_at_depth_is_batch_one_replays_depth_pricing(deep_record):
    """One row: padded and packed are the row's own depth, the round's as batch-1 replay prices it."""
    configs = policies() + [DecodeConfig.of(schedule="depth", depth_policy="0/2,0.7/5", gamma_max=5,
                                            max_new_tokens=N)]
    cost = linear(1)
    walked = predict_batched(deep_record, configs, CostSurface({1: cost}))
    alone = simulate_grid(deep_record, configs, cost)
    assert walked["predicted_time"].to_numpy() == pytest.approx(alone["predicted_time"].to_numpy(), rel=1e-12)
    assert walked["predicted_time_packed"].to_numpy() == pytest.approx(alone["predicted_time"].to_numpy(), rel=1e-12)
    assert walked["predicted_baseline_time"].to_numpy() == pytest.approx(
        alone["predicted_baseline_time"].to_numpy(), rel=1e-12)


def test_a_batched_step_is_priced_at_its_widest_rows_depth(deep_record):
    """Plain decoding by hand: every row advances one token a step. At B = 3 the three prompts run
    together and every step is priced at the 300-token prompt's depth; at B = 2 the first two run
    together (at 300 + j), then the 6-token prompt alone, flat below the shallowest timed depth."""
    surface = CostSurface({b: linear(b) for b in (1, 2, 3)})
    config = DecodeConfig.of(threshold=0.3, gamma_max=G, max_new_tokens=N)
    steps = np.arange(N)
    lengths = deep_record.lengths.tolist()
    assert lengths == [N] * 3  # no EOS: every prompt's N tokens

    def plain(b, d):
        return A_VERIFY * d * (1 + 0.1 * (b - 1))

    three = predict_batched(deep_record, [config.replace(batch_size=3)], surface)
    assert three["predicted_baseline_time"].iloc[0] == pytest.approx(plain(3, 300 + steps).sum(), rel=1e-12)
    two = predict_batched(deep_record, [config.replace(batch_size=2)], surface)
    assert two["predicted_baseline_time"].iloc[0] == pytest.approx(plain(2, 300 + steps).sum() + N * plain(1, 256),
                                                                    rel=1e-12)
    # A policy: priced deeper than flat at the shallow depth, packed (the rows' mean) below padded.
    shallow = CostSurface({b: dataclasses.replace(linear(b, depths=(256,)), by_depth={}) for b in (1, 2, 3)})
    priced = predict_batched(deep_record, [config.replace(batch_size=3)], shallow)
    assert three["predicted_time"].iloc[0] > priced["predicted_time"].iloc[0]
    assert three["predicted_time_packed"].iloc[0] < three["predicted_time"].iloc[0]


def test_step_prices_interpolate_in_depth_as_the_batch_one_model_does():
    surface = CostSurface({1: linear(1), 4: linear(4)})
    prices = step_prices(surface, 4)
    assert prices.at.tolist() == [256.0, 1024.0]
    assert prices.draft.shape == (2, 5) and prices.verify.shape == (2, 5, G + 1)
    for depth in (100.0, 256.0, 700.0, 2000.0):
        draft, verify = surface.at(1).at_depths([max(depth, 256.0)])
        assert draft_row(prices.at, prices.draft, depth)[1] == pytest.approx(draft[0], rel=1e-12)
        assert verify_row(prices.at, prices.verify, depth, 1) == pytest.approx(verify[0], rel=1e-12)


def test_a_depth_policy_of_one_entry_everywhere_walks_as_that_policy_at_every_b(deep_record):
    surface = CostSurface({b: linear(b, prefill=True) for b in (1, 4)})
    single = DecodeConfig.of(threshold=0.3, gamma_max=4, max_new_tokens=N)
    same = DecodeConfig.of(schedule="depth", depth_policy="0.3/4,0.3/4", gamma_max=4, max_new_tokens=N)
    for b in (1, 2, 4):
        walked = predict_batched(deep_record, [single.replace(batch_size=b), same.replace(batch_size=b)], surface)
        for column in ("predicted_time", "predicted_time_packed", "predicted_baseline_time"):
            assert walked[column].iloc[1] == pytest.approx(walked[column].iloc[0], rel=1e-12), (b, column)
    # Different entries: each row's rounds are its bucket's policy's, so it differs from both.
    mixed = DecodeConfig.of(schedule="depth", depth_policy="0/1,0.3/4", gamma_max=4, max_new_tokens=N)
    walked = predict_batched(deep_record, [single.replace(batch_size=4), mixed.replace(batch_size=4)], surface)
    assert walked["predicted_time"].iloc[1] != pytest.approx(walked["predicted_time"].iloc[0], rel=1e-6)


def test_replay_under_load_walks_a_depth_policy(deep_record):
    surface = CostSurface({b: linear(b, prefill=True) for b in (1, 4)})
    single = DecodeConfig.of(threshold=0.3, gamma_max=4, max_new_tokens=N)
    same = DecodeConfig.of(schedule="depth", depth_policy="0.3/4,0.3/4", gamma_max=4, max_new_tokens=N)
    table = replay_load(deep_record, [single, same], surface, [poisson(50.0, 12)], 4)
    rows = table.set_index("config_id")
    for column in ("throughput", "tpot_p50_s", "ttft_p50_s"):
        assert rows.loc[1, column] == pytest.approx(rows.loc[0, column], rel=1e-12)
    assert rows.loc[-1, "tpot_p50_s"] > 0


def test_a_depth_policy_at_batch_8_decodes_the_targets_text_in_the_rounds_replay_walks(llama_pair):
    """Eight prompts on both sides of 256 at B = 8: the target's own greedy text, each row's rounds
    those the record fixes for it (replay.simulate's, which the batched walk prices)."""
    target, draft = llama_pair
    rng = np.random.default_rng(8)
    prompts = [[int(i) for i in rng.integers(2, tiny.VOCAB, n)] for n in (230, 250, 20, 240, 5, 251, 30, 245)]
    config = DecodeConfig.of(schedule="depth", depth_policy="0/2,0.3/5", gamma_max=5, max_new_tokens=20)
    together = batched_speculative(target, draft, prompts, config.replace(batch_size=8), 8)
    plain = DecodeConfig.of(max_new_tokens=20)
    assert [r.result.tokens for r in together] == [autoregressive_decode(target, p, plain).tokens for p in prompts]
    rec = record(SimpleNamespace(target=target, draft=draft, eos_ids=frozenset()), prompts, 20, 5, topk=5)
    for row, replayed in zip(together, simulate(rec, config)):
        assert [(r.drafted, r.accepted) for r in row.result.rounds] == [(r.drafted, r.accepted) for r in replayed]
    assert {r.drafted for row in together for r in row.result.rounds} > {2}  # both buckets' policies ran


def test_a_batched_sweep_over_long_prompts_times_every_batch_size_at_depth(saved_pair, tmp_path):
    """A sweep at B = 2 over prompts past 256 tokens: its prices time B = 2 at the same depths as
    B = 1 (prices.json's by_depth in both), so its batched replay prices each step at its rows' depths."""
    import json

    from typer.testing import CliRunner

    from dspark_bench.cli import app
    from dspark_bench.replay import cost_file

    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    rows = [" ".join(words[(i + k) % len(words)] for k in range(n)) for i, n in enumerate((20, 30, 60, 70))]
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"prompt": r, "category": "long"}) + "\n" for r in rows))
    target, draft = saved_pair
    result = CliRunner().invoke(app, ["sweep", "--target", target, "--draft", draft, "--dataset", str(data),
                                      "--out", str(tmp_path / "out"), "--max-new-tokens", "16", "--threshold", "0.3",
                                      "--gamma-max", "3", "--batch-size", "2", "--confirm-top", "0"])
    assert result.exit_code == 0, result.output
    (folder,) = [p for p in (tmp_path / "out").iterdir() if p.name != "records"]
    surface = cost_file.load(folder / "prices.json").surface
    # B = 2 at 256 and at its own rows' widest (the prompts' own, halfway: where a batch of them reaches).
    widest = surface.at(2).context_tokens
    assert set(surface.at(1).by_depth) == {256} and set(surface.at(2).by_depth) == {256, widest} and widest > 256
    assert surface.at(2).by_depth[widest]["t_verify"] == surface.at(2).t_verify
    assert surface_depths(surface) == (256, widest) and step_prices(surface, 2).deep


def test_a_live_batchs_step_terms_are_fitted_against_its_steps_priced_at_their_depths():
    """A traced step is priced at the depth its widest row began it at (run_under_load's `depth`), so the
    terms a run at depth paid are the ones fitted back, where pricing at one depth would fold the
    depth's cost into them."""
    import pandas as pd

    from dspark_bench.harness.in_decode import fit_terms
    from dspark_bench.harness.under_load import step_costs
    from dspark_bench.replay.cost import StepTerms

    surface = CostSurface({b: linear(b, prefill=True) for b in (1, 4)})
    terms = StepTerms(rows=[0.001 * r for r in range(5)], plain_rows=[0.0005 * r for r in range(5)], join=0.002)
    steps = pd.DataFrame([{"config_id": c, "learned": False, "kind": "step", "rows": r, "forwards": 0 if c < 0 else 3,
                           "longest": 0 if c < 0 else 2, "depth": d, "tokens": np.nan}
                          for c in (-1, 0) for r in range(1, 5) for d in (300, 900, 1500)]
                         + [{"config_id": c, "learned": False, "kind": "join", "rows": 0, "tokens": 700,
                             "forwards": np.nan, "longest": np.nan, "depth": np.nan} for c in (-1, 0)])
    seconds = step_costs(steps, dataclasses.replace(surface, terms=terms))
    deep_step = steps.index[(steps["depth"] == 1500) & (steps["rows"] == 4) & (steps["config_id"] == 0)][0]
    prices = step_prices(surface, 4)
    assert seconds[deep_step] == pytest.approx(3 * draft_row(prices.at, prices.draft, 1500.0)[4]
                                               + verify_row(prices.at, prices.verify, 1500.0, 4)[2] + terms.rows[4])
    fitted = fit_terms(steps.assign(seconds=seconds), surface, {})
    assert fitted.rows == pytest.approx(terms.rows, abs=1e-12)
    assert fitted.plain_rows == pytest.approx(terms.plain_rows, abs=1e-12)
    assert fitted.join == pytest.approx(terms.join, abs=1e-12)


def test_a_traced_step_holds_its_widest_rows_depth(llama_pair):
    from dspark_bench.harness.under_load import run_under_load
    from dspark_bench.replay.arrivals import Arrivals

    target, draft = llama_pair
    prompts = [[1 + i % 50 for i in range(n)] for n in (10, 40)]
    policy = DecodeConfig.of(threshold=0.3, gamma_max=3, max_new_tokens=6)
    _, _, steps = run_under_load(SimpleNamespace(target=target, draft=draft), prompts, [policy],
                                 Arrivals(np.zeros(2), "both at once", 1.0), 2, frozenset())
    plain = steps[(steps["config_id"] < 0) & (steps["kind"] == "step")]
    assert plain["depth"].tolist() == [40 + k for k in range(6)]  # both rows run 6 steps: the 40-token one widest
    spoken = steps[(steps["config_id"] == 0) & (steps["kind"] == "step")]
    assert spoken["depth"].iloc[0] == 40 and spoken["depth"].is_monotonic_increasing


def test_batch_sizes_timed_at_different_depths_are_each_read_along_their_own_axis():
    """B = 4 timed at 256 and 600 (its rows' widest), B = 1 at 256 and 1,024: every depth of either
    priced, each batch size's between or beyond its own points (prices linear in depth: exact)."""
    surface = CostSurface({1: linear(1, (256, 1024)), 4: linear(4, (256, 600))})
    assert surface_depths(surface) == (256, 600, 1024)
    prices = step_prices(surface, 4)
    for depth in (256.0, 600.0, 800.0, 1024.0, 1500.0):
        for rows in (1, 4):
            expected = [A_VERIFY * depth * (1 + 0.1 * (rows - 1)) * (1 + 0.01 * k) for k in range(G + 1)]
            assert verify_row(prices.at, prices.verify, depth, rows) == pytest.approx(expected, rel=1e-9)
            assert draft_row(prices.at, prices.draft, depth)[rows] == pytest.approx(A_DRAFT * depth * rows, rel=1e-9)


def test_a_batched_table_over_long_prompts_holds_one_baseline_column(deep_record):
    """simulate_with_surface over a depth-priced batch-1 model: the walk's baseline, once (the grid's
    own depth-priced baseline column once collided with it as _x / _y)."""
    from dspark_bench.replay.batched import simulate_with_surface

    table = simulate_with_surface(deep_record, [c.replace(batch_size=3) for c in policies()],
                                  CostSurface({b: linear(b) for b in (1, 3)}))
    assert "predicted_baseline_time" in table and not any(c.endswith(("_x", "_y")) for c in table.columns)
    assert (table["predicted_speedup"] == table["predicted_baseline_time"] / table["predicted_time"]).all()


def test_a_depth_axis_read_back_keeps_its_prefills_and_learned_step():
    """CostModel.from_dict kept only the passes of a depth entry: a sweep's prices read back (export,
    calibrate, a check) then priced long prompts' prefills at the one-depth rate."""
    model = linear(1, prefill=True)
    model.by_depth[256]["t_learned"] = 3e-4
    back = CostModel.from_dict(model.to_dict())
    assert back == model
    assert back.prefills([700])[0] == pytest.approx(model.prefills([700])[0]) and back.prefills([700])[0][0] > 0


def test_a_learned_draft_step_is_priced_at_its_depth():
    """The learned signal's host work reads each row's context: timed per depth, a learned policy's draft
    step at depth d costs t_draft(d) + t_learned(d), each read along its own timed depths."""
    models = {b: linear(b) for b in (1, 4)}
    for b, m in models.items():
        for d in m.by_depth:
            m.by_depth[d]["t_learned"] = 1e-6 * d * b
    surface = CostSurface(models)
    plain, learned = step_prices(surface, 4), step_prices(surface, 4, learned=True)
    for depth in (256.0, 640.0, 1024.0, 2048.0):
        extra = draft_row(learned.at, learned.draft, depth)[4] - draft_row(plain.at, plain.draft, depth)[4]
        assert extra == pytest.approx(1e-6 * depth * 4, rel=1e-9)
