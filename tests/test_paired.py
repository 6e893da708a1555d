"""Paired verdicts (dspark_bench/paired.py, harness/verdicts.py): synthetic timings with a known
truth, no clock; identical work recognised on a record; the CLI's verdicts and headline."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from cli_helpers import invoke

from dspark_bench import paired
from dspark_bench.config import DecodeConfig
from dspark_bench.harness import health, verdicts
from dspark_bench.measure.recording import record
from dspark_bench.metrics import bootstrap_speedup
from dspark_bench.tuning.confirm import same_work


def timings(truth: float, prompts: int = 20, passes: int = 1, noise: float = 0.03, spread: float = 0.3,
            suits: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Samples of a reference policy and a candidate `truth`× faster on every prompt, in one process.
    Prompts differ in length and in how well the draft predicts them (log-normal, `spread`: one
    prompt drafts well for both policies); each timing varies by `noise`, and the candidate's gain
    by `suits` per prompt (a policy that suits some prompts better)."""
    rng = np.random.default_rng(seed)
    length, draftable = rng.lognormal(0.0, 0.5, prompts), 1.5 * rng.lognormal(0.0, spread, prompts)
    gain = truth * np.exp(rng.normal(0.0, suits, prompts) - suits**2 / 2)
    rows = []
    for p in range(prompts):
        for r in range(passes):
            for config_id, speed in ((0, draftable[p]), (1, draftable[p] * gain[p])):
                rows.append({"config_id": config_id, "prompt_id": str(p), "turn": 0, "pass": r, "new_tokens": 64,
                             "spec_time_s": length[p] / speed * rng.lognormal(0.0, noise),
                             "baseline_time_s": length[p] * rng.lognormal(0.0, noise), "baseline_new_tokens": 64})
    return pd.DataFrame(rows)


def verdict_of(timed: pd.DataFrame, **kwargs) -> paired.Verdict:
    return paired.compare(timed[timed["config_id"] == 1], timed[timed["config_id"] == 0], "scheduled",
                          "fixed γ=4", **kwargs)


def test_a_known_ratio_is_recovered_and_stated_in_words():
    v = verdict_of(timings(1.08, prompts=40, noise=0.02, seed=1))
    assert v.ratio == pytest.approx(1.08, abs=0.015) and v.low < 1.08 < v.high and v.verdict == "faster"
    assert v.sentence().startswith("scheduled vs fixed γ=4: +8.") and "faster" in v.sentence()
    assert len(v.per_prompt) == 40 and np.median(v.per_prompt) == pytest.approx(1.08, abs=0.02)
    slower = verdict_of(timings(0.9, prompts=40))
    assert slower.verdict == "slower" and slower.high < 1
    none = verdict_of(timings(1.0, prompts=10, noise=0.1))
    assert none.verdict == "no difference detected" and none.low < 1 < none.high
    assert none.prompts_needed == pytest.approx(10 * (none.half_width / 0.05) ** 2, abs=1)
    assert f"about {none.prompts_needed} prompts would detect ±5%" in none.sentence()


def test_the_paired_interval_is_far_narrower_than_two_unpaired_ones():
    """Prompt difficulty widens each policy's own speedup interval, and cancels in the pair."""
    samples = timings(1.08, prompts=40)
    v = verdict_of(samples)
    widths = []
    for config_id in (0, 1):
        one = samples[samples["config_id"] == config_id]
        point, low, high = bootstrap_speedup(one["baseline_time_s"], one["baseline_new_tokens"], one["spec_time_s"],
                                             one["new_tokens"])
        widths.append((high - low) / point)
    assert (v.high - v.low) / v.ratio < min(widths) / 2


@pytest.mark.parametrize("passes,suits", [(1, 0.0), (3, 0.04)])
def test_the_interval_covers_the_truth_at_its_stated_rate(passes, suits):
    truth, draws = 1.05, 200
    inside = [(v.low <= truth <= v.high) for v in (verdict_of(timings(truth, prompts=15, passes=passes, noise=0.05,
                                                                      suits=suits, seed=seed), samples=400, seed=seed)
                                                   for seed in range(draws))]
    assert 0.90 <= np.mean(inside) <= 0.99  # a 95 % interval: about 19 draws in 20


def test_one_timing_cannot_tell_and_unshared_prompts_are_refused():
    one = timings(1.1, prompts=1)
    v = verdict_of(one)
    assert v.verdict == "no difference detected" and v.prompts_needed is None and "one timing" in v.sentence()
    other = one.assign(prompt_id="elsewhere")
    with pytest.raises(Exception, match="share no timed prompt"):
        paired.compare(one[one["config_id"] == 1], other[other["config_id"] == 0])


def table_of(samples: pd.DataFrame, schedules: dict[int, str]) -> pd.DataFrame:
    rows = []
    for config_id, group in samples.groupby("config_id"):
        point, _, _ = bootstrap_speedup(group["baseline_time_s"], group["baseline_new_tokens"], group["spec_time_s"],
                                        group["new_tokens"])
        rows.append({"config_id": config_id, "config_label": f"policy {config_id}", "schedule": schedules[config_id],
                     "batch_size": 1, "speedup": point})
    return pd.DataFrame(rows)


def test_every_policy_is_judged_against_the_best_fixed_gamma():
    samples = timings(1.1, prompts=20)
    slow_fixed = samples[samples["config_id"] == 0].assign(config_id=2, spec_time_s=lambda d: d["spec_time_s"] * 1.3)
    samples = pd.concat([samples, slow_fixed], ignore_index=True)
    table = table_of(samples, {0: "fixed", 1: "threshold", 2: "fixed"})
    assert verdicts.best_fixed(table) == {1: 0}
    _, found = verdicts.judge(samples, table)
    assert [(v["config_id"], v["reference_id"]) for v in found["verdicts"]] == [(1, 0), (2, 0)]
    assert found["headline"]["config_id"] == 1 and found["headline"]["verdict"] == "faster"
    assert found["verdicts"][1]["verdict"] == "slower"


def noisy(base: pd.DataFrame, number: int, noise: float) -> pd.DataFrame:
    """Pass `number` of the same prompts (their lengths, how they draft, how they suit the policy):
    only the timing noise is new."""
    rng = np.random.default_rng(100 + number)
    return base.assign(spec_time_s=base["spec_time_s"] * rng.lognormal(0.0, noise, len(base)), **{"pass": number})


def fake_passes(base: pd.DataFrame, noise: float, calls: list):
    """Another pass of the synthetic pair, as runner.another_pass would time it."""
    def another(pair_ids, number):
        assert pair_ids == (1, 0)  # the candidate, then the reference: config_ids of `base`
        calls.append(number)
        return noisy(base, number, noise)
    return another


def test_a_precision_target_is_reached_by_more_passes_or_said_otherwise():
    calls: list[int] = []
    base = timings(1.05, prompts=20, noise=0.0)
    samples, state = verdicts.sharpen(noisy(base, 0, 0.06), (1, 0), fake_passes(base, 0.06, calls), 0.03, 600)
    assert state.ended == "reached" and state.half_width <= 0.03 and state.passes == len(calls) + 1 > 1
    assert samples["pass"].nunique() == state.passes and "reached" in state.sentence()
    assert state.estimate_s is not None  # said after the second pass
    # The prompts themselves differ by more than ±3 %: more passes cannot get there, and it says so.
    calls = []
    base = timings(1.05, prompts=10, noise=0.0, suits=0.15)
    _, state = verdicts.sharpen(noisy(base, 0, 0.01), (1, 0), fake_passes(base, 0.01, calls), 0.03, 600)
    assert state.ended == "more prompts needed" and len(calls) == 1 and "give more prompts" in state.sentence()
    # No time: the budget is spent, and said.
    base = timings(1.05, prompts=10, noise=0.0)
    _, state = verdicts.sharpen(noisy(base, 0, 0.08), (1, 0), fake_passes(base, 0.08, []), 0.001, 0.0)
    assert state.ended == "budget spent" and "budget ran out" in state.sentence()


def test_identical_rounds_are_checked_paired():
    samples = timings(1.0, prompts=12, noise=0.02).assign(rounds=30, drafted_total=90, accepted_total=60,
                                                           draft_forwards=95)
    assert health.identical_rounds(samples).verdict == "ok"
    apart = samples.assign(spec_time_s=np.where(samples["config_id"] == 1, samples["spec_time_s"] * 1.4,
                                                samples["spec_time_s"]))
    check = health.identical_rounds(apart)
    assert check.verdict == "unreliable" and check.numbers["largest_ratio"] == pytest.approx(1.4, rel=0.05)
    other_work = samples.assign(rounds=np.where(samples["config_id"] == 1, 31, 30))
    assert health.identical_rounds(other_work) is None  # nothing did the same work


def test_policies_doing_the_same_work_are_recognised_on_the_record(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    rec = record(pair, [[0, 5, 9, 11], [7, 3, 3]], 16, 6, topk=5)
    configs = [DecodeConfig.of(schedule="fixed", gamma_max=4, min_draft_len=0, max_new_tokens=16),
               DecodeConfig.of(threshold=0.0, gamma_max=4, min_draft_len=0, max_new_tokens=16),  # never binds
               DecodeConfig.of(threshold=0.9, gamma_max=4, min_draft_len=0, max_new_tokens=16),
               DecodeConfig.of(schedule="fixed", gamma_max=4, min_draft_len=0, max_new_tokens=16, batch_size=2)]
    shared = same_work([0, 1, 2, 3], configs, {configs[0].drafting: rec})
    assert shared == {0: 0, 1: 0, 2: 2, 3: 3}


def test_run_with_two_policies_prints_and_stores_the_paired_verdicts(saved_pair, prompts_file, tmp_path):
    target, draft = saved_pair
    result = invoke("run", "--target", target, "--draft", draft, "--dataset", prompts_file, "--out", tmp_path,
                    "--schedule", "fixed", "--schedule", "threshold", "--threshold", "0.3", "--gamma-max", "3",
                    "--max-new-tokens", "8", "--repeats", "1")
    assert result.exit_code == 0, result.output
    assert "paired on the same prompts" in result.output and "scheduled vs best fixed γ" in result.output
    (folder,) = tmp_path.iterdir()
    summary = json.loads((folder / "summary.json").read_text())
    (verdict,) = summary["verdicts"]
    assert verdict["reference"] == "fixed γ=3" and verdict["prompts"] == 3 and summary["headline"] == verdict
    assert verdict["low"] <= verdict["ratio"] <= verdict["high"]


def test_the_t_quantile_is_students_at_every_degree_of_freedom():
    """The project's one t quantile (paired intervals, sampled replay's): a t table's three
    decimals up to 30 degrees of freedom, Cornish-Fisher beyond; never the normal's 1.96."""
    from scipy.stats import t

    for dof in range(1, 31):
        assert paired.t_quantile(dof) == pytest.approx(t.ppf(0.975, dof), abs=5e-4), dof
    for dof in (31, 32, 40, 100, 1000):
        assert paired.t_quantile(dof) == pytest.approx(t.ppf(0.975, dof), abs=2e-6), dof
    with pytest.raises(ValueError):
        paired.t_quantile(0)


def test_batched_policies_are_paired_on_their_own_plain_decodings_clock():
    """At B > 1 policies run one after another, each beside its own plain decoding: a candidate as
    fast as the fixed γ relative to plain decoding, timed while the machine ran 25 % slower, is the
    same, not 20 % slower; at batch 1 (every side interleaved) raw seconds are paired as before."""
    samples = timings(1.0, prompts=20, noise=0.01)
    slow = samples["config_id"] == 1
    samples.loc[slow, ["spec_time_s", "baseline_time_s"]] *= 1.25
    for batch_size, ratio in ((8, 1.0), (1, 0.8)):
        table = table_of(samples, {0: "fixed", 1: "threshold"}).assign(batch_size=batch_size)
        found = verdicts.paired_verdicts(samples.assign(batch_size=batch_size), table)
        assert found[0]["ratio"] == pytest.approx(ratio, rel=0.03), batch_size
