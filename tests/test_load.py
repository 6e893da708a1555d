"""Replay under load (replay/under_load.py): requests arriving over time, served by continuous batching.

The replay must be the batched decoder's own server: with every step costing what the cost
surface says (a clock that the steps advance by their own prices), the decoder under the same
arrivals stamps every request's first and last token where the walk does, to the float.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import tiny
from test_batched import PROMPTS, SURFACE, Logged
from test_budget import MODEL as BUDGET_MODEL

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding import batched as batched_decoder
from dspark_bench.decoding.batch_lm import BatchLM
from dspark_bench.decoding.batched import AutoregressiveStep, SpeculativeStep, serve
from dspark_bench.errors import DsparkError
from dspark_bench.harness.under_load import in_decode_ratios, in_decode_surface, run_under_load, step_costs
from dspark_bench.measure.recording import record
from dspark_bench.replay import under_load
from dspark_bench.replay.batched import predict_batched, walks
from dspark_bench.replay.cost import CostSurface, StepTerms
from dspark_bench.replay.slots import spliced

N = 12
# Two at once, one mid-run, a gap the server idles through, then a burst: its third request
# arrives while the first two are prefilled and joins with them, its fourth waits for a free row.
ARRIVALS = np.array([0.0, 0.0, 0.04, 0.05, 0.6, 3.0, 3.0, 3.02, 3.03])
B = 3
# Prefill seconds per prompt token (target, draft): a burst's prefills outlast 0.02 s.
PREFILL = (4e-3, 1e-3)
# Seconds per position of the batch's caches a joining row is spliced into (replay/slots.spliced): a
# request joining two rows of about 40 tokens pays 0.008 s past its prefill, one joining none nothing.
JOIN_SLOTS = 1e-4
PRICES = CostSurface({**SURFACE.models, 1: dataclasses.replace(SURFACE.at(1), t_prefill_target=PREFILL[0],
                                                               t_prefill_draft=PREFILL[1])},
                     StepTerms([0.0] * (B + 1), [0.0] * (B + 1), 0.0, join_slots=JOIN_SLOTS))
POLICIES = [
    DecodeConfig.of(metric="entropy", threshold=0.5, gamma_max=5, max_new_tokens=N, batch_size=B),
    DecodeConfig.of(schedule="fixed", gamma_max=3, max_new_tokens=N, batch_size=B),
    DecodeConfig.of(metric="top1", threshold=0.6, gamma_max=5, min_draft_len=1, batch_quorum=0.5, max_new_tokens=N,
                    batch_size=B),
    DecodeConfig.of(schedule="goodput", goodput_model=tiny.GOODPUT_MODEL, gamma_max=5, min_draft_len=0,
                    max_new_tokens=N, batch_size=B),
    DecodeConfig.of(schedule="budget", goodput_model=str(BUDGET_MODEL), gamma_max=4, max_new_tokens=N,
                    batch_size=B),
]


@pytest.fixture(scope="module")
def setting(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset({1}))
    ids = [PROMPTS[i % len(PROMPTS)] for i in range(len(ARRIVALS))]
    return pair, ids, record(pair, ids, N, 5, topk=5, eos_ids=pair.eos_ids)


class Priced(Logged):
    """A step that advances a clock by what the surface charges for it (padded layout)."""

    def __init__(self, step, clock: list[float], t_draft, t_verify):
        super().__init__(step)
        self.clock, self.t_draft, self.t_verify = clock, t_draft, t_verify

    def __call__(self, requests):
        super().__call__(requests)
        rows, forwards, longest, _ = self.steps[-1]
        self.clock[0] += forwards * self.t_draft[rows] + self.t_verify[rows, longest]


def served_on_the_surface(monkeypatch, pair, ids, config, plain: bool, trace=None) -> list:
    """The batched decoder serving ARRIVALS, its clock the surface's prices of its own steps and
    of each request's admission: its prefill, and the splice of the target's cache (a row's context
    is its cache and the token it has not fed yet)."""
    clock = [0.0]
    monkeypatch.setattr(batched_decoder, "_clock", lambda device: clock[0])
    add = BatchLM.add

    def priced_add(lm, tokens):
        if lm.model is pair.target:
            clock[0] += JOIN_SLOTS * spliced(lm.rows, max(lm.lengths, default=-1) + 1, len(tokens))
        add(lm, tokens)
        clock[0] += len(tokens) * PREFILL[0 if lm.model is pair.target else 1]

    monkeypatch.setattr(BatchLM, "add", priced_add)
    t_draft, t_verify = PRICES.tables(B)
    target_lm, draft_lm = BatchLM(pair.target), BatchLM(pair.draft)
    step = (AutoregressiveStep(target_lm, config, pair.eos_ids) if plain
            else SpeculativeStep(target_lm, draft_lm, config, pair.eos_ids))
    lms = [target_lm] if plain else [target_lm, draft_lm]
    return serve(ids, config, B, lms, Priced(step, clock, t_draft, t_verify), pair.eos_ids, True, None,
                 list(ARRIVALS), trace)


def walked(rec, configs) -> dict:
    """Each walk's (first, last token) stamps, by config_id (-1: plain decoding)."""
    stamps = {}

    def keep(first, end):
        return {"first": first.copy(), "end": end.copy()}

    for row in walks(rec, configs, PRICES, True, ARRIVALS, keep):
        stamps[row["config_id"]] = (row["first"], row["end"])
    return stamps


def test_the_load_replay_is_the_decoder_s_own_server(monkeypatch, setting):
    pair, ids, rec = setting
    stamps = walked(rec, POLICIES)
    for config_id, config in [(-1, POLICIES[1])] + list(enumerate(POLICIES)):
        trace = []
        served = served_on_the_surface(monkeypatch, pair, ids, config, plain=config_id < 0, trace=trace)
        # The trace prices as the walk does: every step and join at what its clock advanced.
        steps = pd.DataFrame([{"config_id": config_id, "learned": False, "kind": e[0], "rows": e[1],
                               **({"tokens": e[2], "depth": e[3]} if e[0] == "join" else
                                  {"forwards": e[2], "longest": e[3]}),
                               "seconds": e[-1]} for e in trace])
        assert (steps["kind"] == "join").sum() == len(ARRIVALS)
        np.testing.assert_allclose(step_costs(steps, PRICES), steps["seconds"], rtol=1e-9, atol=1e-15)
        first, end = stamps[config_id]
        assert [r.arrival for r in served] == list(ARRIVALS)
        assert all(r.admitted >= r.arrival for r in served)  # nobody joins before it arrives
        np.testing.assert_allclose([r.first_token for r in served], first, rtol=1e-12, err_msg=config.label())
        np.testing.assert_allclose([r.finished for r in served], end, rtol=1e-12, err_msg=config.label())
    # The server stood empty between 0.6's request and 3.0's: the burst starts at its arrival; the
    # request arriving at 3.02 joined during the first two's prefills, the one at 3.03 after.
    assert min(stamps[-1][0][5:]) > 3.0 and max(stamps[-1][1][:5]) < 3.0
    served = served_on_the_surface(monkeypatch, pair, ids, POLICIES[1], plain=False)
    assert served[5].admitted == 3.0 and served[7].admitted < served[5].first_token < served[8].admitted


def test_every_request_waiting_at_the_start_is_the_batched_walk(setting):
    _, _, rec = setting
    predicted = predict_batched(rec, POLICIES, PRICES)
    at_once = under_load.Arrivals(np.zeros(len(rec.lengths)), "at once", np.inf)
    table = under_load.replay_load(rec, POLICIES, PRICES, [at_once], B)
    plain = table[table["config_id"] < 0].iloc[0]
    assert plain["makespan_s"] == pytest.approx(predicted["predicted_baseline_time"].iloc[0], rel=1e-12)
    policies = table[table["config_id"] >= 0].sort_values("config_id")
    np.testing.assert_allclose(policies["makespan_s"], predicted["predicted_time"], rtol=1e-12)
    tokens = rec.lengths.sum()
    np.testing.assert_allclose(policies["throughput"], tokens / predicted["predicted_time"], rtol=1e-12)
    assert list(policies["config_label"]) == [c.policy_label() for c in POLICIES]


def test_serving_metrics_by_hand():
    arrive, first, end = np.array([0.0, 1.0, 1.0]), np.array([0.5, 1.5, 3.0]), np.array([2.5, 2.0, 3.0])
    tokens = np.array([5, 2, 1])
    out = under_load.serving_metrics(arrive, first, end, tokens, tpot_limit=0.4)
    # TPOT: (2.5 - 0.5) / 4 = 0.5 and (2.0 - 1.5) / 1 = 0.5; the one-token request has none.
    assert out["tpot_p50_s"] == pytest.approx(0.5) and out["tpot_p99_s"] == pytest.approx(0.5)
    assert out["ttft_p50_s"] == pytest.approx(0.5)
    assert out["ttft_p99_s"] == pytest.approx(np.percentile([0.5, 0.5, 2.0], 99))
    assert out["throughput"] == pytest.approx(8 / 3.0)
    assert out["goodput"] == pytest.approx(1 / 3.0)  # only the one-token request is within 0.4 s per token
    assert under_load.serving_metrics(arrive, first, end, tokens, tpot_limit=0.5)["goodput"] == pytest.approx(8 / 3.0)
    assert under_load.serving_metrics(arrive, first, end, tokens, ttft_limit=1.0)["goodput"] == pytest.approx(7 / 3.0)


def test_poisson_arrivals_are_seeded_and_at_their_rate():
    a, b = under_load.poisson(4.0, 4000, seed=3), under_load.poisson(4.0, 4000, seed=3)
    assert np.array_equal(a.times, b.times) and a.times[0] == 0.0 and np.all(np.diff(a.times) >= 0)
    assert not np.array_equal(a.times, under_load.poisson(4.0, 4000, seed=4).times)
    assert (len(a.times) - 1) / a.times[-1] == pytest.approx(4.0, rel=0.05)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(DsparkError, match="arrival rate must be a number above 0"):
            under_load.poisson(bad, 10)


def test_a_trace_is_read_and_a_bad_one_refused_in_one_line(tmp_path: Path):
    good = tmp_path / "arrivals.txt"
    good.write_text("arrival_s\n# seconds\n10.0\n10.5\n12\n")
    trace = under_load.read_trace(good)
    assert list(trace.times) == [0.0, 0.5, 2.0] and trace.rate == pytest.approx(1.0)
    cases = {"missing.txt": None, "words.txt": "0\nsoon\n", "backwards.txt": "0\n2\n1\n", "empty.txt": "# none\n",
             "negative.txt": "-1\n"}
    messages = {"missing.txt": "cannot read the arrival trace", "words.txt": "words.txt:2: an arrival time",
                "backwards.txt": "must not decrease", "empty.txt": "holds no arrival time",
                "negative.txt": "finite number >= 0"}
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(DsparkError, match=messages[name]) as err:
            under_load.read_trace(tmp_path / name)
        assert "\n" not in str(err.value)


def test_a_max_batch_beyond_the_surface_is_refused(setting):
    _, _, rec = setting
    with pytest.raises(DsparkError, match="--max-batch 9 is beyond the cost surface, measured up to B = 8"):
        under_load.replay_load(rec, POLICIES, SURFACE, [under_load.poisson(1.0, 4)], 9)


def test_more_requests_than_prompts_repeat_the_prompts(setting):
    _, _, rec = setting
    tiled = under_load.requests_of(rec, 20)
    assert np.array_equal(tiled.lengths, rec.lengths[np.arange(20) % len(rec.lengths)])
    assert np.array_equal(tiled.rollout[len(rec.lengths)], rec.rollout[0])


def test_verdicts_pick_per_rate(setting):
    _, _, rec = setting
    loads = [under_load.poisson(rate, 30, seed=1) for rate in (0.5, 50.0)]
    table = under_load.replay_load(rec, POLICIES, SURFACE, loads, B)
    assert len(table) == 2 * (len(POLICIES) + 1)
    out = under_load.verdicts(table, "throughput")
    assert [v["arrival_rate"] for v in out] == [0.5, 50.0]
    for v, (_, group) in zip(out, table.groupby("arrival_rate")):
        assert v["best"]["throughput"] == pytest.approx(group[group["config_id"] >= 0]["throughput"].max())
        assert v["best_fixed"]["config_label"] == "fixed γ=3 · B=3"
        assert v["plain"]["config_label"] == under_load.PLAIN
    low = under_load.verdicts(table, "tpot_p50")[1]
    assert low["best"]["tpot_p50_s"] == pytest.approx(table[(table["arrival_rate"] == 50.0)
                                                            & (table["config_id"] >= 0)]["tpot_p50_s"].min())
    # A limit nothing meets leaves no best policy, said as such.
    assert under_load.verdicts(table, "throughput", tpot_limit=1e-9)[0]["best"] is None
    with pytest.raises(DsparkError, match="unknown load objective"):
        under_load.verdicts(table, "latency")


def test_a_real_run_under_load_serves_every_request_losslessly(setting):
    pair, ids, _ = setting
    arrivals = under_load.Arrivals(ARRIVALS / 100, "test", 1.0)
    summary, requests, steps = run_under_load(pair, PROMPTS, POLICIES[:2], arrivals, B, pair.eos_ids)
    assert list(summary["config_label"]) == [under_load.PLAIN] + [c.policy_label() for c in POLICIES[:2]]
    assert summary["identical"].all()
    assert (requests["admitted_s"] >= requests["arrival_s"]).all()
    assert (requests["finished_s"] >= requests["first_token_s"]).all()
    assert (summary["throughput"] > 0).all() and (summary["tpot_p99_s"] >= summary["tpot_p50_s"]).all()
    assert isinstance(requests, pd.DataFrame) and len(requests) == 3 * len(ARRIVALS)
    assert sorted(steps["config_id"].unique()) == [-1, 0, 1] and (steps["kind"] == "join").sum() == 3 * len(ARRIVALS)
    ratios = in_decode_ratios(steps, SURFACE)
    assert (ratios["ratio"] > 0).all() and ratios["count"].sum() == len(steps)
    # Scaled by those ratios, the surface charges each row count's steps what they took, in all.
    scaled = in_decode_surface(SURFACE, ratios.assign(seconds=ratios["priced"] * 1.5))
    assert scaled.at(8).t_verify == pytest.approx([1.5 * t for t in SURFACE.at(8).t_verify])
    assert scaled.at(1).t_draft == pytest.approx(1.5 * SURFACE.at(1).t_draft)


@pytest.mark.parametrize("flags, message", [
    (["--arrival-rate", "0"], "an arrival rate must be a number above 0 requests per second, each given once "
                              "(got 0.0)"),
    (["--arrival-rate", "2", "--arrival-rate", "2"], "each given once"),
    (["--arrival-trace", "no-such-trace.txt"], "cannot read the arrival trace no-such-trace.txt"),
    (["--arrival-rate", "1", "--max-batch", "16"], "--max-batch 16 is beyond the cost surface, timed at the sweep's "
                                                   "batch sizes (1, 8); add --batch-size 16"),
    (["--arrival-rate", "1", "--load-objective", "goodput"], "--load-objective goodput counts the requests within "
                                                             "--tpot-limit: give one"),
    (["--arrival-rate", "1", "--load-objective", "p90"], "unknown load objective 'p90'"),
    (["--arrival-rate", "1", "--requests", "0"], "requests must be at least 1 (got 0)"),
    (["--arrival-rate", "1", "--tpot-limit", "-1"], "tpot_limit must be above 0 (got -1)"),
    (["--arrival-rate", "1", "--evaluation", "real"], "replay under load (--arrival-rate, --arrival-trace) needs "
                                                      "--evaluation replay"),
    (["--tpot-limit", "0.05"], "--tpot-limit has no effect here: it needs a load (--arrival-rate or "
                               "--arrival-trace)"),
])
def test_a_bad_load_is_refused_in_one_line_before_any_work(tmp_path, monkeypatch, flags, message):
    from cli_helpers import invoke, one_error_line

    monkeypatch.chdir(tmp_path)
    result = invoke("sweep", "--task", "code", "--batch-size", "1", "--batch-size", "8", *flags,
                    "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert message in one_error_line(result)
    assert not (tmp_path / "out").exists()  # nothing recorded, nothing written


def test_the_surface_timed_beside_a_run_covers_every_cell(llama_pair):
    from dspark_bench.decoding.batched import interleave
    from dspark_bench.measure.between_steps import CostBetweenSteps

    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, device=target.device)
    context = PROMPTS[-1] + PROMPTS[2]
    sampler = CostBetweenSteps(pair, context, 3, [1, 2])
    with pytest.raises(DsparkError, match="no timing of"):  # nothing timed yet
        sampler.surface()
    turns = []

    def decoder():
        for _ in range(3 * len(sampler.cells)):
            turns.append(sampler.turns)
            yield
        return []

    interleave(decoder(), decoder(), beside=sampler.step)  # one pass per turn of both
    assert turns[::2] == list(range(1, 3 * len(sampler.cells) + 1))
    surface = sampler.surface()
    assert sorted(surface.models) == [1, 2]
    for model in surface.models.values():
        assert model.t_draft > 0 and len(model.t_verify) == 4 and min(model.t_verify) > 0 and model.t_learned >= 0
    assert surface.at(1).t_prefill_target > 0 and surface.at(1).t_prefill_draft > 0
