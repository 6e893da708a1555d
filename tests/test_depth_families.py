"""A depth policy whose buckets run any family's policy (issue 67): entries that name their own
metric, schedule and min_draft_len, refused in one line where malformed, run by our decoder as
replay walks them, priced round by round, and composed by the depth search from every family."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import tiny

from dspark_bench import schedules
from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.learned_signal import FILE, LearnedSignal
from dspark_bench.decoding.rules import at_depth, bucket_policies
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.depth import DEPTH_LABELS, depth_bucket, depth_policy, round_depths
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record
from dspark_bench.replay import learned
from dspark_bench.replay.simulate import CostModel, simulate, simulate_priced
from dspark_bench.results import write_json

N, G = 40, 6


def test_an_entry_names_its_own_family_and_bad_ones_are_refused_in_one_line():
    config = DecodeConfig.of(schedule="depth", depth_policy="0.3/4, margin:fixed:0/3/0 ,top1:cumulative:0.2/6/2",
                             min_draft_len=1)
    assert config.stopping.depth_policy == "0.3/4,margin:fixed:0/3/0,top1:cumulative:0.2/6/2"  # as its label writes it
    assert config.stopping.gamma_max == 6 and schedules.any_family(config)
    shallow, second, deep = bucket_policies(config)[:3]
    assert (shallow.stopping.schedule, shallow.stopping.metric, shallow.stopping.threshold, shallow.stopping.gamma_max,
            shallow.stopping.min_draft_len) == ("threshold", "top1", 0.3, 4, 1)
    assert (second.stopping.schedule, second.stopping.metric, second.stopping.gamma_max,
            second.stopping.min_draft_len) == ("fixed", "margin", 3, 0)
    assert (deep.stopping.schedule, deep.stopping.threshold, deep.stopping.min_draft_len) == ("cumulative", 0.2, 2)
    assert bucket_policies(config)[-1] == deep  # the last entry holds deeper
    assert [e.own for e in depth_policy(config.stopping.depth_policy)][:3] == [False, True, True]
    refused = {
        "0.3/4,top1:budget:0/4/0": "a bucket runs one of threshold, cumulative, fixed, goodput, not 'budget'",
        "0.3/4,top1:goodput:0/4/0": "needs a goodput model",
        "learned:threshold:0.3/4/1": "the learned metric needs its fitted signal",
        "0.3/4,foo:threshold:0.2/3/0": "unknown confidence metric 'foo'",
        "0.3/4,top1:threshold:0.2/3": "is not threshold/gamma_max nor metric:schedule:threshold/gamma_max/",
        "top1::0.2/3/1": "is not threshold/gamma_max",
        "0.3/4,top1:threshold:0.2/3/5": "its min_draft_len must be in [0, gamma_max]",
        "0.3/4,top1:threshold:x/3/1": "its threshold must be a number",
    }
    for text, why in refused.items():
        with pytest.raises(DsparkError, match=why.replace("(", r"\(").replace("[", r"\[")) as err:
            DecodeConfig.of(schedule="depth", depth_policy=text)
        assert "\n" not in str(err.value)
    with pytest.raises(DsparkError, match="runs at batch size 1, on the draft model"):
        DecodeConfig.of(schedule="depth", depth_policy="0.3/4,margin:fixed:0/3/0", batch_size=4)
    # A plain depth policy still runs at any batch size.
    assert DecodeConfig.of(schedule="depth", depth_policy="0.3/4,0.2/3", batch_size=4).batching.batch_size == 4


@pytest.fixture(scope="module")
def crossing(llama_pair, tmp_path_factory):
    """Prompts whose output crosses depth 256, their record with its learned signal fitted and saved."""
    target, draft = llama_pair
    rng = np.random.default_rng(1)
    prompts = [[int(i) for i in rng.integers(2, tiny.VOCAB, n)] for n in (236, 250, 40)]
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    rec = record(pair, prompts, N, G, topk=5)
    path = tmp_path_factory.mktemp("learned") / FILE
    fitted = learned.evaluate(rec)
    write_json(path, fitted)
    return pair, prompts, learned.with_learned(rec, LearnedSignal.from_dict(fitted)), str(path)


def mixed_policies(path: str) -> list[DecodeConfig]:
    files = {"signal_model": path, "goodput_model": tiny.GOODPUT_MODEL, "max_new_tokens": N}
    return [DecodeConfig.of(schedule="depth", depth_policy="learned:threshold:0.5/5/1,top1:goodput:0/4/0", **files),
            DecodeConfig.of(schedule="depth", metric="margin", depth_policy="0.3/3,learned:goodput:0/6/0",
                            min_draft_len=1, **files),
            DecodeConfig.of(schedule="depth", depth_policy="top1:fixed:0/2/0,entropy:cumulative:0.2/6/2",
                            semantics="hf", max_new_tokens=N)]


def test_a_depth_policy_of_any_family_decodes_as_replay_walks_it(crossing):
    """Each round runs its bucket's policy of whatever family (learned, goodput, fixed, cumulative):
    our decoder's rounds equal replay's round for round, and its output the target's own."""
    pair, prompts, rec, path = crossing
    buckets = set()
    for config in mixed_policies(path):
        for prompt, rounds in zip(prompts, simulate(rec, config)):
            real = speculative_decode(pair.target, pair.draft, prompt, config)
            assert [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens, r.target_token, r.draft_forwards)
                    for r in rounds] == [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens,
                                          r.target_token, r.draft_forwards) for r in real.rounds], config.label()
            assert real.tokens == autoregressive_decode(pair.target, prompt, config).tokens
            depths = round_depths(len(prompt), [r.emitted for r in rounds])
            buckets |= set(depth_bucket(depths).tolist())
            for depth, r in zip(depths, rounds):
                assert r.drafted <= at_depth(config, int(depth)).stopping.gamma_max
    assert buckets == {0, 1}


def test_only_the_learned_buckets_rounds_pay_the_learned_signal(crossing):
    """Priced round by round: each round's verify, first-step excess and draft steps, and the learned
    signal's host work on the draft steps of the rounds whose bucket runs a learned policy alone."""
    _, prompts, rec, path = crossing
    cost = CostModel(t_draft=0.001, t_verify=[0.010 + 0.0005 * k for k in range(G + 1)], context_tokens=64,
                     t_learned=0.0007, t_first_draft=0.0003)
    for config in mixed_policies(path)[:2]:
        expected = 0.0
        for prompt, rounds in zip(prompts, simulate(rec, config)):
            depths = round_depths(len(prompt), [r.emitted for r in rounds])
            for depth, r in zip(depths, rounds):
                paid = cost.t_draft + (cost.t_learned if at_depth(config, int(depth)).stopping.metric == LEARNED else 0)
                expected += cost.t_verify[r.drafted] + (cost.t_first_draft if r.draft_forwards else 0.0) \
                    + r.draft_forwards * paid
        table, by_depth = simulate_priced(rec, config, cost)
        assert table["predicted_time"].iloc[0] == pytest.approx(expected, rel=1e-12)
        assert by_depth["predicted_time"].sum() == pytest.approx(expected, rel=1e-12)
        assert set(by_depth["depth_bucket"]) <= set(DEPTH_LABELS)


def test_the_depth_search_composes_each_buckets_cheapest_policy_of_any_family(crossing):
    """Each bucket's choice is the cheapest per token of every family the entries may run (learned and
    goodput rules beside plain ones); the composed policy runs exactly those choices, stands as a
    policy of its own (its knobs read back), and is replayed exactly."""
    from dspark_bench.config import from_dict
    from dspark_bench.replay.simulate import simulate_grid, simulate_grid_by_depth
    from dspark_bench.sections.depth import depth_search

    _, _, rec, path = crossing
    # Draft steps cheap below 256 tokens and dear past it: the buckets choose differently.
    verify = [0.010 + 0.001 * k for k in range(G + 1)]
    cost = CostModel(t_draft=0.002, t_verify=verify, context_tokens=64, t_learned=0.0004, t_first_draft=0.0003,
                     by_depth={200: {"t_draft": 0.0002, "t_verify": verify},
                               256: {"t_draft": 0.008, "t_verify": verify}})
    files = {"signal_model": path, "goodput_model": tiny.GOODPUT_MODEL, "max_new_tokens": N}
    configs = [DecodeConfig.of(metric=m, threshold=t, gamma_max=g, max_new_tokens=N,
                               signal_model=path if m == LEARNED else "")
               for m in ("top1", LEARNED) for t in (0.2, 0.5, 0.8) for g in (2, 4, G)]
    configs += [DecodeConfig.of(schedule="goodput", metric=m, gamma_max=g, min_draft_len=0, **files)
                for m in ("top1", LEARNED) for g in (4, G)]
    configs += [DecodeConfig.of(schedule="cumulative", threshold=0.3, gamma_max=G, max_new_tokens=N)]
    configs += [DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=g, min_draft_len=0, max_new_tokens=N)
                for g in (1, 3)]
    choice = depth_search(rec, configs, cost)
    assert choice is not None and schedules.of(choice.config).by_depth
    assert len(set(choice.per_bucket["config_id"])) == 2  # two families, or two of one
    assert from_dict(choice.config.to_dict()) == choice.config
    _, by_depth = simulate_grid_by_depth(rec, configs, cost)
    per_token = by_depth.assign(t=by_depth["predicted_time"] / by_depth["emitted_total"])
    runs = bucket_policies(choice.config)
    for pick in choice.per_bucket.itertuples():
        there = per_token[per_token["depth_bucket"] == pick.depth_bucket]
        assert pick.seconds_per_token == pytest.approx(there["t"].min())
        mine, theirs = runs[DEPTH_LABELS.index(pick.depth_bucket)].stopping, configs[pick.config_id].stopping
        assert (mine.schedule, mine.metric, mine.gamma_max, mine.min_draft_len) == (
            theirs.schedule, theirs.metric, theirs.gamma_max, theirs.min_draft_len)
        assert mine.threshold == theirs.threshold or not schedules.of(theirs).one_threshold
    exact, _ = simulate_priced(rec, choice.config, cost)
    assert choice.row["predicted_time"].iloc[0] == exact["predicted_time"].iloc[0]
    assert exact["predicted_time"].iloc[0] <= 1.05 * simulate_grid(rec, configs, cost)["predicted_time"].min()


def test_a_buckets_choice_says_no_threshold_where_its_rule_reads_none():
    from dspark_bench.sections.depth import threshold_of

    assert threshold_of(DecodeConfig.of(threshold=0.35)) == 0.35
    assert threshold_of(DecodeConfig.of(schedule="cumulative", threshold=0.2)) == 0.2
    assert threshold_of(DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=3)) == 0.0  # fixed γ: threshold 0
    assert threshold_of(DecodeConfig.of(schedule="goodput", goodput_model=tiny.GOODPUT_MODEL, threshold=0.05)) is None


def test_every_path_that_meets_such_a_policy_reads_its_entries_or_refuses_it(crossing, tmp_path):
    """A run's grid keeps the files its entries read; replay refuses a record without the learned
    signal a bucket reads; a batched or served walk, which reads one metric for a batch's rows,
    refuses it in one line; the sweep's load stage leaves it out."""
    from typer.testing import CliRunner

    from dspark_bench.cli import app
    from dspark_bench.config import expand
    from dspark_bench.replay.batched import walks
    from dspark_bench.sections.under_load import load_policies

    _, _, rec, path = crossing
    text = "learned:threshold:0.5/4/1,top1:goodput:0/4/0"
    (config,) = expand({"schedule": ["depth"], "depth_policy": [text], "goodput_model": [tiny.GOODPUT_MODEL],
                        "signal_model": [path], "max_new_tokens": [N]})
    assert (config.stopping.goodput_model, config.stopping.signal_model) == (tiny.GOODPUT_MODEL, path)
    without = dataclasses.replace(rec, confidences={k: v for k, v in rec.confidences.items() if k != LEARNED})
    with pytest.raises(DsparkError, match="holds no learned signal"):  # its top-level metric is top1's
        simulate(without, config)
    with pytest.raises(DsparkError, match="replays at batch size 1"):
        list(walks(rec, [config], SimpleNamespace(models={1: CostModel(0.001, [0.01] * (G + 1), 64)})))
    assert load_policies([config, DecodeConfig.of(max_new_tokens=N)], 1) == [1]
    result = CliRunner().invoke(app, ["run", "--task", "code", "--limit", "1", "--schedule", "depth", "--depth-policy",
                                      "0.3/4,top1:fixed:0/3/0", "--arrival-rate", "1", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "runs a depth policy of plain threshold/gamma_max entries" in result.output
    assert not any(tmp_path.iterdir())  # refused before any work
