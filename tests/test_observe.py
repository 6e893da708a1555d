"""`dspark-bench observe` (engines/counters.py, engines/observed.py): each engine's counters read from
its own exposition format, a window taken between scrapes, per-position rates with intervals, the
advice from counters alone held to a brute-force truncation, bad inputs in one line with nothing
written, and a real llama-server's counters against its own per-request counts."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from cli_helpers import invoke, one_error_line

from dspark_bench.config import DecodeConfig
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


def test_sglang_s_per_request_counts_are_a_window(tmp_path):
    """SGLang's responses (native meta_info, and the OpenAI endpoints' sglext) summed; its histogram of
    accepted drafts per verify step gives every position."""
    native = {"meta_info": {"completion_tokens": 261, "spec_verify_ct": 80, "spec_num_correct_drafts": 180,
                            "spec_num_proposed_drafts": 240, "spec_correct_drafts_histogram": [6, 10, 22, 42]}}
    openai = {"sglext": {"spec_tokens_details": {"spec_verify_ct": 10, "spec_num_correct_drafts": 14,
                                                 "spec_num_proposed_drafts": 30,
                                                 "spec_correct_drafts_histogram": [2, 4, 2, 2]}}}
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps(native) + "\n\n" + json.dumps(openai) + "\n")
    counts, how = window([str(path)], None)
    assert counts == Counts("sglang", 90, 270, 194, (74 + 8, 64 + 4, 42 + 2)) and "requests it holds" in how
    assert sum(counts.per_position) == counts.accepted and Observed(counts).draft_length == 3
    timings = tmp_path / "llama.jsonl"
    timings.write_text(json.dumps({"content": "x", "timings": {"draft_n": 10, "draft_n_accepted": 4}}) + "\n")
    with pytest.raises(DsparkError, match="not rounds or positions"):
        window([str(timings)], None)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(json.dumps(native) + "\n{oops\n")
    with pytest.raises(DsparkError, match="line 2 is not JSON"):
        window([str(broken)], None)


def test_a_window_is_the_change_between_two_scrapes(tmp_path):
    before, after = tmp_path / "a.prom", tmp_path / "b.prom"
    before.write_text(vllm_scrape(100, [80, 50, 20], 3))
    after.write_text(vllm_scrape(1100, [880, 550, 220], 3))
    counts, how = window([str(before), str(after)], None)
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
        "it does nothing": [str(good), str(good), "--window", "30"],
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
    from dspark_bench.engines.served import check_target, served_by
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
        served = served_by([server.url("/metrics")])
    # What it says it serves is the pair's target: its /v1/models parameter count (engines/served.py).
    check_target(served, pair.describe(), "the shipped pair")
    assert served.params and served.names
    with pytest.raises(DsparkError, match="parameter target"):
        check_target(served, {**pair.describe(), "target_params": served.params // 2}, "another pair")
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


# --- profiles out, and a window held against a real sweep ------------------------------------------


def test_a_profile_s_rates_are_modelopt_s_for_the_same_steps():
    """ModelOpt's own worked case (its test_offset_and_densification): 100 steps emitting 1, 2 and 3
    tokens 40, 30 and 30 times at K = 3 give marginal 0.6, 0.3, 0 and conditional 0.6, 0.5, 0."""
    from dspark_bench.engines.profiles import Profile, dynamo_args, modelopt, sglang_env, vllm_synthetic

    profile = Profile(3, {0: 40, 1: 30, 2: 30})
    assert profile.marginal == pytest.approx([0.6, 0.3, 0.0]) and profile.conditional == pytest.approx([0.6, 0.5, 0.0])
    assert profile.mean_accept_length == pytest.approx(1.9)
    policy = DecodeConfig.of(schedule="fixed", gamma_max=3)
    data = json.loads(json.dumps(modelopt(profile, policy, {"draft": "d", "target": "t"}, {}, {})))
    assert data["schema_version"] == "1.0" and data["acceptance_length_histogram"] == {"1": 40, "2": 30, "3": 30}
    assert data["validation"]["mean_consistency"]["passed"] and data["validation"]["marginal_monotonicity"]["passed"]
    assert data["num_speculative_tokens"] == 3 == len(data["conditional_accept_rates"])
    # vLLM 0.34's checks on synthetic_acceptance_rates (vllm/config/speculative.py):
    # length K, each in [0, 1], non-increasing.
    rates = vllm_synthetic(profile)["synthetic_acceptance_rates"]
    assert len(rates) == 3 and all(0 <= r <= 1 for r in rates) and all(a >= b for a, b in zip(rates, rates[1:]))
    assert dynamo_args(Profile(7, {0: 5, 7: 5}))[1].startswith("# K = 7")  # Dynamo samples at most 5
    assert dynamo_args(profile)[0] == "--aic-nextn 3 --aic-nextn-accept-rates 0.600000,0.500000,0.000000\n"
    # SGLang's own environment parser reads what the file sets.
    from sglang.srt.environ import envs

    values = dict(line.split("=") for line in sglang_env(profile).split())
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        assert envs.SGLANG_SIMULATE_ACC_LEN.get() == pytest.approx(1.9)
        assert envs.SGLANG_SIMULATE_ACC_METHOD.get() == "match-expected"
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.update({k: v})


@pytest.fixture(scope="module")
def llamacpp_sweep(saved_pair, prompts_file, tmp_path_factory):
    """A replay sweep of the tiny pair under llama.cpp's rule (nothing timed, isolated prices). Its best
    policy follows this machine's timings; at 48 tokens a prompt any policy of γ ≤ 3 makes at least 36
    rounds on the three prompts, above the 30 a drift verdict needs (at 24, one made 28 in CI)."""
    target, draft = saved_pair
    out = tmp_path_factory.mktemp("sweep")
    result = invoke("sweep", "--target", target, "--draft", draft, "--dataset", str(prompts_file), "--out", str(out),
                    "--max-new-tokens", "48", "--semantics", "llamacpp", "--threshold", "0.2", "--threshold", "0.5",
                    "--gamma-max", "3", "--confirm-top", "0", "--isolated-prices")
    assert result.exit_code == 0, result.output
    return next(p for p in out.iterdir() if "-sweep-" in p.name)


def test_a_sweep_s_profile_is_its_best_policy_replayed(llamacpp_sweep, tmp_path):
    from dspark_bench.engines.profiles import replayed_profiles
    from dspark_bench.engines.run_policies import run_policies

    result = invoke("profile", str(llamacpp_sweep), "--out", str(tmp_path / "p"))
    assert result.exit_code == 0, result.output
    run = run_policies(llamacpp_sweep)
    policy = run.best[min(run.best)][0]
    whole, per_category = replayed_profiles(run.rec, policy)
    data = json.loads((tmp_path / "p" / "speculation_profile.json").read_text())
    assert data["marginal_accept_rates"] == [round(x, 6) for x in whole.marginal]
    assert sorted(data["per_category"]) == ["code", "prose"] == sorted(per_category)
    assert sum(p.rounds for p in per_category.values()) == whole.rounds
    vllm = json.loads((tmp_path / "p" / "vllm_speculative_config.json").read_text())
    assert vllm["rejection_sample_method"] == "synthetic"
    assert vllm["num_speculative_tokens"] == policy.stopping.gamma_max
    again = invoke("profile", str(llamacpp_sweep), "--out", str(tmp_path / "p"))
    assert again.exit_code == 1 and "never overwritten" in one_error_line(again)


def test_a_window_of_the_predicted_counts_is_as_predicted_and_a_shifted_one_drifted(llamacpp_sweep, tmp_path):
    from dspark_bench.engines.drift import deployed, predicted, sweep_of

    run = sweep_of(llamacpp_sweep)
    policy = deployed(run, "llamacpp")
    expected, _ = predicted(run.rec, policy, "llamacpp")
    scaled = Counts("llamacpp", expected.rounds * 20, expected.draft_tokens * 20, expected.accepted * 20,
                    tuple(p * 20 for p in expected.per_position))
    # Traffic the draft does not know: nothing accepted (a record of three prompts decides no smaller shift).
    shifted = Counts("llamacpp", scaled.rounds, scaled.draft_tokens, 0, (0,) * len(scaled.per_position))
    empty = Counts("llamacpp", 0, 0, 0, (0,) * len(expected.per_position))
    statuses = []
    for name, counts in (("same", scaled), ("shifted", shifted)):
        before, after = tmp_path / f"{name}-0.prom", tmp_path / f"{name}-1.prom"
        before.write_text(llamacpp_scrape(empty))
        after.write_text(llamacpp_scrape(counts))
        result = invoke("observe", str(before), str(after), "--against", str(llamacpp_sweep), "--out", str(tmp_path))
        statuses.append(result.exit_code)
        assert ("as predicted" if name == "same" else "drifted:") in result.output, result.output
    assert statuses == [0, 1]


def llamacpp_scrape(counts: Counts) -> str:
    lines = [f"llamacpp:spec_decode_num_{name}_total {value}" for name, value in
             (("drafts", counts.rounds), ("draft_tokens", counts.draft_tokens), ("accepted_tokens", counts.accepted))]
    lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
              for i, v in enumerate(counts.per_position)]
    return "\n".join(lines) + "\n"


def test_any_policy_s_profile_is_that_policy_replayed(llamacpp_sweep, tmp_path):
    """The knobs given replace the best policy's: fixed γ = 2 (1 where that is the best) profiled is that
    policy replayed, written by default beside the best's; a knob the policy would not read, or a draft
    deeper than the record, is refused in one line with nothing written."""
    from dspark_bench.engines.profiles import replayed_profiles
    from dspark_bench.engines.run_policies import run_policies

    run = run_policies(llamacpp_sweep)
    best = run.best[min(run.best)][0]
    gamma = 1 if (best.stopping.schedule, best.stopping.gamma_max) == ("fixed", 2) else 2  # a policy not the best
    fixed = best.replace(schedule="fixed", gamma_max=gamma)
    result = invoke("profile", str(llamacpp_sweep), "--schedule", "fixed", "--gamma-max", str(gamma))
    assert result.exit_code == 0, result.output
    (folder,) = [p for p in llamacpp_sweep.iterdir() if p.name.startswith("profiles-")]
    assert folder.name == f"profiles-fixed-g-{gamma}" and f"fixed γ={gamma}" in result.output
    data = json.loads((folder / "speculation_profile.json").read_text())
    whole, _ = replayed_profiles(run.rec, fixed)
    assert data["num_speculative_tokens"] == gamma and data["measurement_conditions"]["policy"] == fixed.label()
    assert data["marginal_accept_rates"] == [round(x, 6) for x in whole.marginal]
    cases = {"has no effect here": ["--schedule", "fixed", "--threshold", "0.4"],
             "replays drafts of at most 3": ["--gamma-max", "5"],
             "already exists": ["--schedule", "fixed", "--gamma-max", str(gamma)]}
    for message, args in cases.items():
        refused = invoke("profile", str(llamacpp_sweep), *args)
        assert refused.exit_code == 1 and message in one_error_line(refused), (message, refused.output)
    assert sorted(p.name for p in llamacpp_sweep.iterdir() if p.name.startswith("profiles")) == [folder.name]


VLLM_MODELS = {"object": "list", "data": [{"id": "coder", "object": "model", "root": "/models/acme/coder-7b"}]}
LLAMA_MODELS = {"models": [{"name": "target-f32.gguf", "model": "/srv/target-f32.gguf", "aliases": ["prod"]}],
                "object": "list", "data": [{"id": "/srv/target-f32.gguf", "meta": {"n_params": 14754301}}]}


def test_what_an_engine_names_is_held_to_the_sweep_s_target():
    """/v1/models as vLLM and llama-server answer it; a parameter count decides over names (within 0.1 %:
    a GGUF's own tensors), a name matches by fingerprint or its last two path parts, a bare generic
    part (`target`) by nothing alone; --served-model names the target where the engine calls it otherwise."""
    from dspark_bench.engines.served import Served, check_target, from_model_list, same_name

    assert from_model_list(VLLM_MODELS) == Served(("coder", "/models/acme/coder-7b"))
    assert from_model_list(LLAMA_MODELS) == Served(("/srv/target-f32.gguf", "target-f32.gguf", "prod"), 14754301)
    shipped = {"target": "/work/dspark_bench/reference/weights/target", "target_fingerprint": "76f618b95dc56137",
               "target_params": 14754048}
    hub = {"target": "/cache/acme/coder-7b", "target_fingerprint": "aa"}
    assert same_name("76f618b95dc56137", shipped) and same_name("weights/target", shipped)
    assert not same_name("target", shipped) and not same_name("/work/long/target", shipped)
    assert same_name("acme/coder-7b", hub) and same_name("coder-7b", hub) and not same_name("acme/coder-13b", hub)
    check_target(Served(("/srv/target-f32.gguf",), 14754301), shipped, "sweep")  # 253 more: a GGUF's RoPE tensors
    check_target(Served(()), shipped, "sweep")  # the engine says nothing: nothing is checked
    check_target(Served(("prod",)), shipped, "sweep", served_model="prod")
    refusals = {"39,840-parameter target": (Served(("/srv/target-f32.gguf",), 39840), None),
                "serves acme/coder-13b": (Served(("acme/coder-13b",)), None),
                "--served-model prod is not among them": (Served(("canary",)), "prod")}
    for message, (served, name) in refusals.items():
        with pytest.raises(DsparkError, match=message):
            check_target(served, shipped, "sweep", served_model=name)


def test_against_a_sweep_of_another_pair_is_refused_before_the_window(llamacpp_sweep, tmp_path):
    """A saved scrape's model_name labels, a .jsonl's models and a live /v1/models answer that name
    another target: one line, exit 2, nothing written (a live URL's window never taken)."""
    import http.server
    import threading

    from dspark_bench.engines.drift import deployed, predicted, sweep_of

    run = sweep_of(llamacpp_sweep)
    expected, _ = predicted(run.rec, deployed(run, "llamacpp"), "llamacpp")
    text = llamacpp_scrape(Counts("llamacpp", expected.rounds * 5, expected.draft_tokens * 5, expected.accepted * 5,
                                  tuple(p * 5 for p in expected.per_position)))
    other = tmp_path / "other.prom"
    other.write_text(text.replace("_total ", '_total{model_name="acme/coder-13b"} ', 3).replace(
        '{position=', '{model_name="acme/coder-13b",position='))
    jsonl = tmp_path / "other.jsonl"
    jsonl.write_text(json.dumps({"model": "acme/coder-13b", "meta_info": {"spec_verify_ct": 2}}) + "\n")
    asked = []

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            asked.append(self.path)
            body = json.dumps({"data": [{"id": "tiny.gguf", "meta": {"n_params": 123}}]}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    out = tmp_path / "out"
    try:
        for source, message in ((str(other), "serves acme/coder-13b"), (str(jsonl), "serves acme/coder-13b"),
                                (url, "serves a 123-parameter target")):
            result = invoke("observe", source, "--against", str(llamacpp_sweep), "--out", str(out))
            assert result.exit_code == 2 and message in one_error_line(result), result.output
    finally:
        server.shutdown()
    assert asked == ["/v1/models"] and not out.exists()
    named = invoke("observe", str(other), "--against", str(llamacpp_sweep), "--served-model", "acme/coder-13b",
                   "--out", str(out))
    assert "written:" in named.output and "serves" not in named.output, named.output  # the window was read
    alone = invoke("observe", str(other), "--served-model", "x", "--out", str(out))
    assert alone.exit_code == 1 and "it needs --against" in one_error_line(alone)
