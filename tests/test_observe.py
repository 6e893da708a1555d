"""`dspark-bench observe` (engines/counters.py, engines/observed.py): each engine's counters read from
its own exposition format, a window taken between scrapes, per-position rates with intervals, the
advice from counters alone held to a brute-force truncation, bad inputs in one line with nothing
written, and a real llama-server's counters against its own per-request counts."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cli_helpers import invoke, one_error_line

from dspark_bench.engines.counters import Counts, read_scrape, window
from dspark_bench.engines.observed import Observed, advice, wilson
from dspark_bench.errors import DsparkError
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.cost_file import CostFile


def vllm_scrape(drafts: int, per_position: list[int], k: int, engines: int = 2) -> str:
    """vLLM 0.34.0's exposition (vllm/v1/spec_decode/metrics.py), one series per engine index (the
    counts split between them), `_created` series beside each counter."""
    lines = []
    for name, value in (("num_drafts", drafts), ("num_draft_tokens", drafts * k),
                        ("num_accepted_tokens", sum(per_position))):
        lines += [f"# HELP vllm:spec_decode_{name}_total x", f"# TYPE vllm:spec_decode_{name}_total counter"]
        lines += [f'vllm:spec_decode_{name}_total{{engine="{e}",model_name="m"}} {share(value, e, engines)}.0'
                  for e in range(engines)]
        lines += [f"# TYPE vllm:spec_decode_{name}_created gauge",
                  f'vllm:spec_decode_{name}_created{{engine="0",model_name="m"}} 1.765e+09']
    lines += ["# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{e}",model_name="m",position="{i}"}} '
              f"{share(v, e, engines)}.0" for i, v in enumerate(per_position) for e in range(engines)]
    return "\n".join(lines) + "\n"


def share(value: int, engine: int, engines: int) -> int:
    return value // engines + (value % engines if engine == 0 else 0)


LLAMACPP = """# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 259
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 167
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 87
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 70
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 55
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 42
"""

TRTLLM = """# TYPE trtllm_spec_decode_num_draft_tokens_total counter
trtllm_spec_decode_num_draft_tokens_total{engine_type="trtllm",model_name="m"} 24000.0
# TYPE trtllm_spec_decode_num_accepted_tokens_total counter
trtllm_spec_decode_num_accepted_tokens_total{engine_type="trtllm",model_name="m"} 15000.0
# TYPE trtllm_spec_decode_drafted_tokens_total counter
trtllm_spec_decode_drafted_tokens_total{engine_type="trtllm",model_name="m",token_position="0"} 8000.0
trtllm_spec_decode_drafted_tokens_total{engine_type="trtllm",model_name="m",token_position="1"} 8000.0
trtllm_spec_decode_drafted_tokens_total{engine_type="trtllm",model_name="m",token_position="2"} 8000.0
# TYPE trtllm_spec_decode_accepted_tokens_total counter
trtllm_spec_decode_accepted_tokens_total{engine_type="trtllm",model_name="m",token_position="0"} 6500.0
trtllm_spec_decode_accepted_tokens_total{engine_type="trtllm",model_name="m",token_position="1"} 5000.0
trtllm_spec_decode_accepted_tokens_total{engine_type="trtllm",model_name="m",token_position="2"} 3500.0
"""

SGLANG = """# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.12
"""


def test_each_engine_s_counters_are_read_from_its_own_exposition():
    vllm = read_scrape(vllm_scrape(10001, [8101, 6001, 4401], 3))
    assert vllm == Counts("vllm", 10001, 30003, 18503, (8101, 6001, 4401))  # both engines summed, _created skipped
    assert read_scrape(LLAMACPP) == Counts("llamacpp", 87, 259, 167, (70, 55, 42))
    trt = read_scrape(TRTLLM)
    assert trt.engine == "trtllm" and trt.rounds == 8000 and trt.per_position == (6500, 5000, 3500)
    assert trt.drafted == (8000, 8000, 8000) and trt.accepted == 15000


def test_a_window_is_the_change_between_two_scrapes(tmp_path):
    before, after = tmp_path / "a.prom", tmp_path / "b.prom"
    before.write_text(vllm_scrape(100, [80, 50, 20], 3))
    after.write_text(vllm_scrape(1100, [880, 550, 220], 3))
    counts, how = window([str(before), str(after)], 0)
    assert counts == Counts("vllm", 1000, 3000, 1500, (800, 500, 200)) and str(before) in how
    waited = []
    urls = {"http://x/metrics": iter([before.read_text(), after.read_text()])}
    import dspark_bench.engines.counters as counters

    original = counters.scrape
    counters.scrape = lambda url: next(urls[url])
    try:
        counts, how = window(["http://x/metrics"], 30, wait=waited.append)
    finally:
        counters.scrape = original
    assert counts.rounds == 1000 and waited == [30] and "over 30 s" in how


def test_per_position_rates_and_their_intervals():
    observed = Observed(Counts("llamacpp", 87, 259, 167, (70, 55, 42)))
    rows = observed.positions()
    # llama.cpp's own log line for these counts: rate per position (0.805, 0.632, 0.483).
    assert [r["survival"] for r in rows] == pytest.approx([70 / 87, 55 / 87, 42 / 87])
    assert [r["conditional"] for r in rows] == pytest.approx([70 / 87, 55 / 70, 42 / 55])
    assert wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # the textbook case
    assert rows[1]["conditional_interval"] == wilson(55, 70)
    mean, low, high = observed.mean_accepted()
    assert mean == pytest.approx(167 / 87) and low < mean < high
    data = observed.to_dict()
    assert data["acceptance_length"] == pytest.approx(1 + 167 / 87) and data["positions_consistent"]
    assert data["draft_length"] == 3  # 259 of 261: a request's last drafts cut to the tokens it had left
    assert Observed(Counts("llamacpp", 100, 200, 150, (70, 50, 30))).draft_length is None  # a p-min's 2 of 3


def test_the_advice_is_the_truncation_of_every_round():
    """Counters of rounds that each drafted K = 5 and accepted L: a draft cut to K' accepts min(L, K'),
    so the advice's mean accepted length is the brute-force mean, and its speedup the cost model's."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.geometric(0.35, 4000) - 1, 5)
    counts = Counts("vllm", len(lengths), 5 * len(lengths), int(lengths.sum()),
                    tuple(int((lengths >= i + 1).sum()) for i in range(5)))
    cost = CostModel(0.002, [0.010, 0.011, 0.012, 0.013, 0.015, 0.016], 64, t_round=0.001, t_plain=0.0105)
    told = advice(Observed(counts), cost)
    assert told["deployed"] == 5 and [r["draft_length"] for r in told["by_length"]] == [0, 1, 2, 3, 4, 5]
    for row in told["by_length"][1:]:
        cut = row["draft_length"]
        truncated = np.minimum(lengths, cut)
        assert row["mean_accepted"] == pytest.approx(truncated.mean())
        per_round = cut * 0.002 + cost.t_verify[cut] + 0.001
        assert row["speedup"] == pytest.approx((1 + truncated.mean()) * 0.0105 / per_round)
        low, high = row["speedup_interval"]
        assert low < row["speedup"] < high
        half = (row["mean_accepted_interval"][1] - row["mean_accepted_interval"][0]) / 2
        assert half == pytest.approx(1.959964 * truncated.std() / math.sqrt(len(lengths)), rel=1e-6)
    best = max(told["by_length"], key=lambda r: r["speedup"])
    assert told["best"] == best["draft_length"] and "past the deployed 5" in told["note"]
    with pytest.raises(DsparkError, match="varied in length"):
        advice(Observed(Counts("llamacpp", 100, 200, 150, (70, 50, 30))), cost)


def test_bad_inputs_end_in_one_line_and_write_nothing(tmp_path):
    out = tmp_path / "out"
    good = tmp_path / "good.prom"
    good.write_text(LLAMACPP)
    backwards = tmp_path / "restart.prom"
    backwards.write_text(LLAMACPP.replace(" 87\n", " 3\n"))
    sglang, empty, garbage = tmp_path / "s.prom", tmp_path / "e.prom", tmp_path / "g.prom"
    sglang.write_text(SGLANG)
    empty.write_text("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 4.0\n")
    garbage.write_text("this is not { prometheus\n")
    cases = {
        "cannot be reached": ["http://127.0.0.1:9/metrics", "--window", "1"],
        "restarted inside the window": [str(good), str(backwards)],
        "is SGLang's": [str(sglang)],
        "no speculative decoding counters": [str(empty)],
        "not a Prometheus text exposition": [str(garbage)],
        "neither a metrics URL": [str(tmp_path / "missing.prom")],
        "no speculative round finished": [str(good), str(good)],
        "above 0": ["http://127.0.0.1:9/metrics", "--window", "0"],
        "is not a file": [str(good), "--prices", str(tmp_path / "nope.json")],
    }
    for message, args in cases.items():
        result = invoke("observe", *args, "--out", str(out))
        assert result.exit_code == 1 and message in one_error_line(result), (message, result.output)
    assert not out.exists() or not any(out.iterdir())


def test_observe_writes_the_window_and_the_advice(tmp_path):
    before, after = tmp_path / "a.prom", tmp_path / "b.prom"
    before.write_text(vllm_scrape(0, [0, 0, 0, 0], 4))
    after.write_text(vllm_scrape(2000, [1500, 900, 400, 100], 4))
    surface = CostSurface({1: CostModel(0.004, [0.020, 0.021, 0.022, 0.023, 0.030], 64)})
    prices = tmp_path / "prices.json"
    CostFile(surface, {"name": "vllm"}, {"target": "t", "draft": "d"}, "test", {}, "").save(prices)
    result = invoke("observe", str(before), str(after), "--prices", str(prices), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "out").iterdir()
    written = json.loads((folder / "observed.json").read_text())
    assert written["rounds"] == 2000 and written["draft_length"] == 4
    assert [p["accepted_rounds"] for p in written["positions"]] == [1500, 900, 400, 100]
    assert written["advice"]["deployed"] == 4 and f"advice: draft length {written['advice']['best']}" in result.output
    assert "per draft position" in result.output and "cannot be seen" in result.output


def test_a_live_llama_server_s_counters_are_its_own_per_request_counts(tmp_path):
    """llama-server (--metrics) serving the shipped pair at a fixed K = 3: the window's counts equal
    the sum of its per-request `timings` and verification steps, every round drafted 3, and the
    positions add up to the accepted tokens."""
    from test_engines import llama_server_or_skip

    from dspark_bench.config import DecodeConfig
    from dspark_bench.engines.counters import scrape
    from dspark_bench.engines.files import llamacpp_flags
    from dspark_bench.engines.llama_server import LlamaServer
    from dspark_bench.engines.llamacpp_run import found_build
    from dspark_bench.harness.gguf import write_gguf
    from dspark_bench.harness.models import load_pair
    from dspark_bench.tasks import load_prompts
    from dspark_bench.tasks.prompts import encode

    binary, _, version = found_build(str(llama_server_or_skip()))
    pair = load_pair(device="cpu")
    target, draft = (write_gguf(m, pair.tokenizer, tmp_path / f"{role}.gguf", "f32")
                     for role, m in (("target", pair.target), ("draft", pair.draft)))
    flags = llamacpp_flags(DecodeConfig.of(schedule="fixed", gamma_max=3), str(draft), version)
    prompts = [encode(pair.tokenizer, p.text, "auto") for p in load_prompts("code", None, "train", None, None, 3)[0]]
    with LlamaServer(binary, target, flags) as server:
        before = read_scrape(scrape(server.url("/metrics")))
        answers = [server.complete(ids, 24) for ids in prompts]
        after = read_scrape(scrape(server.url("/metrics")))
    counts = after.since(before)
    assert counts.draft_tokens == sum(a["timings"]["draft_n"] for a in answers) > 0
    assert counts.accepted == sum(a["timings"].get("draft_n_accepted", 0) for a in answers)
    assert counts.rounds == sum(a["counters"]["spec_decode_num_drafts_total"] for a in answers)
    assert sum(counts.per_position) == counts.accepted and len(counts.per_position) == 3
    assert Observed(counts).draft_length == 3


def test_replay_s_counts_are_the_rounds_that_carried_a_draft(llama_pair):
    from types import SimpleNamespace

    from dspark_bench.config import DecodeConfig
    from dspark_bench.engines.drift import predicted
    from dspark_bench.measure.recording import record
    from dspark_bench.replay.simulate import simulate

    target, draft = llama_pair
    prompts = [[0, 5, 9, 11], [7], [3, 3, 40, 2, 8, 100, 17]]
    rec = record(SimpleNamespace(target=target, draft=draft, eos_ids=frozenset()), prompts, 24, 4, topk=5)
    policy = DecodeConfig.of(semantics="llamacpp", threshold=0.3, gamma_max=4, min_draft_len=0, max_new_tokens=24)
    counts, effects = predicted(rec, policy, "llamacpp")
    rounds = [r for prompt in simulate(rec, policy) for r in prompt]
    carried = [r for r in rounds if r.drafted]
    assert counts.rounds == len(carried) and counts.accepted == sum(r.accepted for r in rounds)
    assert counts.per_position == tuple(sum(r.accepted > i for r in carried) for i in range(4))
    assert sum(counts.per_position) == counts.accepted and counts.draft_tokens == sum(r.drafted for r in rounds)
    assert len(effects) == 4 and all(e >= 1 for e in effects)


def test_the_design_effect_is_the_variance_between_prompts_over_a_binomial_s():
    from dspark_bench.engines.drift import design_effect

    assert design_effect([5, 5, 5, 5], [10, 10, 10, 10]) == 1.0  # prompts alike: no more than binomial
    hits, sizes = [9, 1, 9, 1], [10, 10, 10, 10]  # half the prompts accept almost always, half almost never
    rate, n = 0.5, 40
    between = 4 / 3 * sum((h - rate * m) ** 2 for h, m in zip(hits, sizes)) / n ** 2
    assert design_effect(hits, sizes) == pytest.approx(between / (rate * (1 - rate) / n)) and between > 0.25 / n


def test_the_verdict_names_the_positions_that_drifted():
    from dspark_bench.config import DecodeConfig
    from dspark_bench.engines.drift import compare

    policy = DecodeConfig.of(schedule="fixed", gamma_max=3)
    expected = Counts("llamacpp", 4000, 12000, 4400, (2400, 1400, 600))
    same = Counts("llamacpp", 1000, 3000, 1110, (605, 352, 153))  # the same rates within chance
    assert compare(same, expected, policy)["verdict"] == "as predicted"
    shifted = Counts("llamacpp", 1000, 3000, 950, (600, 200, 150))  # position 1: 0.20 against 0.35
    verdict = compare(shifted, expected, policy)
    assert verdict["verdict"] == "drifted" and verdict["drifted_positions"] == [1]
    row = verdict["positions"][1]
    assert row["difference"] == pytest.approx(0.2 - 0.35) and row["difference_interval"][1] < 0
    slight = Counts("llamacpp", 100000, 300000, 108000, (58000, 35000, 15000))  # significant, but 0.02 < 0.05
    assert compare(slight, expected, policy)["verdict"] == "as predicted"
    # The same shift, seen over prompts whose rounds are alike (design effect 20): within chance.
    assert compare(shifted, expected, policy, (1.0, 20.0, 1.0))["verdict"] == "as predicted"
    few = Counts("llamacpp", 20, 60, 10, (6, 3, 1))
    assert compare(few, expected, policy)["verdict"] == "no verdict"
    wider = Counts("llamacpp", 1000, 5000, 1110, (605, 352, 153, 0, 0))
    assert "not the deployed one" in compare(wider, expected, policy)["why"]


def test_against_a_folder_without_a_record_is_no_verdict(tmp_path):
    before, after = tmp_path / "a.prom", tmp_path / "b.prom"
    before.write_text(vllm_scrape(0, [0, 0, 0], 3))
    after.write_text(vllm_scrape(200, [150, 90, 40], 3))
    for folder, message in ((tmp_path / "nowhere", "not a run folder"),):
        result = invoke("observe", str(before), str(after), "--against", str(folder), "--out", str(tmp_path / "o"))
        assert result.exit_code == 2 and message in one_error_line(result)
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
