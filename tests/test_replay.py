"""Replay: rounds simulated from one record equal the real engine's, for every kind of policy."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import tiny

from dspark_bench import schedules
from dspark_bench.config import DRAFT_MODES, METRICS, SCHEDULES, SEMANTICS, DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.confidence import SIGNALS
from dspark_bench.decoding.rules import at_depth, discards_below
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.depth import depth_bucket, round_depths
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record
from dspark_bench.replay.simulate import CostModel, Record, simulate, simulate_grid, spanning_policies

PROMPTS = [[0, 5, 9, 11], [7], [3, 3, 40, 2, 8, 100, 17], [12, 13]]
N, G = 24, 6
# What a grid walks: not the depth schedule (its rounds are its buckets' threshold policies': walked
# alone, test_a_depth_policy_replays_as_our_decoder_runs_it).
GRID_SCHEDULES = [s for s in SCHEDULES if not schedules.named(s).by_depth]


def policies() -> list[DecodeConfig]:
    return spanning_policies(G, N, tiny.GOODPUT_MODEL) + [
        DecodeConfig.of(metric="margin", threshold=0.2, gamma_max=G, min_draft_len=G, max_new_tokens=N),
        DecodeConfig.of(schedule="cumulative", threshold=0.1, gamma_max=G, max_new_tokens=N)]


@pytest.fixture(scope="module", params=["plain", "eos"])
def recorded(request, llama_pair):
    target, draft = llama_pair
    eos = frozenset()
    if request.param == "eos":  # a token the target emits mid-sequence, so EOS ends some prompts early
        eos = frozenset({autoregressive_decode(target, PROMPTS[0], DecodeConfig.of(max_new_tokens=N)).tokens[10]})
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=eos)
    return pair, record(pair, PROMPTS, N, G, topk=5)


@pytest.mark.parametrize("draft_mode", DRAFT_MODES)
def test_simulated_rounds_equal_our_decoder(recorded, draft_mode):
    """Replay == engine round for round; in verify-side mode the rule cuts each full draft on the
    device, so the rounds are the same but the draft ran to its limit every time."""
    pair, rec = recorded
    compared = 0
    for config in policies():
        simulated = simulate(rec, config)
        for prompt, rounds in zip(PROMPTS, simulated):
            real = speculative_decode(pair.target, pair.draft, prompt, config.replace(draft_mode=draft_mode),
                                      pair.eos_ids).rounds
            assert len(rounds) == len(real), config.label()
            for j, (mine, theirs) in zip(itertools.accumulate([0] + [r.emitted for r in rounds]), zip(rounds, real)):
                assert (mine.drafted, mine.accepted, mine.emitted, mine.stop_reason, mine.draft_tokens,
                        mine.target_token) == (theirs.drafted, theirs.accepted, theirs.emitted, theirs.stop_reason,
                                               theirs.draft_tokens, theirs.target_token), config.label()
                if draft_mode == "early-stop":
                    assert mine.draft_forwards == theirs.draft_forwards
                else:  # every step to the round's limit: gamma_max, the budget, or none (llama.cpp's rule)
                    limit = min(config.stopping.gamma_max, N - j - 1)
                    assert theirs.draft_forwards == (0 if limit < discards_below(config) else limit)
                assert mine.confidences == pytest.approx(theirs.confidences[: len(mine.confidences)], abs=1e-5)
                compared += 1
    assert len(policies()) >= 20 and compared > 500


def test_grid_totals_equal_round_by_round_simulation(recorded):
    _, rec = recorded
    configs = policies()
    cost = CostModel(t_draft=0.001, t_verify=[0.01 + 0.001 * k for k in range(G + 1)], context_tokens=10,
                     t_first_draft=0.0004)
    grid = simulate_grid(rec, configs, cost)
    for config, row in zip(configs, grid.itertuples()):
        rounds = [r for prompt_rounds in simulate(rec, config) for r in prompt_rounds]
        assert row.rounds == len(rounds)
        assert row.drafted_total == sum(r.drafted for r in rounds)
        assert row.accepted_total == sum(r.accepted for r in rounds)
        assert row.emitted_total == sum(r.emitted for r in rounds)
        assert row.full_blocks == sum(r.accepted == r.drafted for r in rounds)
        assert row.draft_forwards == sum(r.draft_forwards for r in rounds)
        assert row.predicted_speedup == pytest.approx(cost.predict(rounds, row.emitted_total))
        # every round of the draft model's that drafts pays its first step's excess once, however long
        # its draft; one that runs no draft step (a prompt's last token) none
        assert row.predicted_time == pytest.approx(sum(r.draft_forwards * 0.001 + cost.t_verify[r.drafted]
                                                       + (0.0004 if r.draft_forwards else 0.0) for r in rounds))
        assert any(r.draft_forwards == 0 for r in rounds)


def random_record(seed: int, P: int = 12, n: int = 40, g: int = 7) -> Record:
    """A record with the features that make rounds end early: EOS in the continuation and in
    rollouts, sequences shorter than max_new_tokens, NaN and tied confidences."""
    rng = np.random.default_rng(seed)
    eos = 1
    continuation = rng.integers(2, 30, size=(P, n))
    lengths = np.where(rng.random(P) < 0.5, rng.integers(1, n + 1, size=P), n)
    for p, length in enumerate(lengths):
        if length < n:
            continuation[p, length - 1], continuation[p, length:] = eos, -1
    rollout = np.empty((P, n, g), dtype=np.int64)
    for k in range(g):
        ahead = np.full((P, n), -2)
        ahead[:, : n - k] = continuation[:, k:]
        rollout[:, :, k] = np.where(rng.random((P, n)) < 0.7, ahead, rng.choice([eos, 0, 5], size=(P, n)))
    confidences = {}
    for metric in SIGNALS:  # the metrics and llama.cpp's own top1, which its rule reads
        values = rng.choice([0.0, 0.25, 0.5, 1.0, np.nan], size=(P, n, g),
                            p=[0.1, 0.1, 0.1, 0.1, 0.6]).astype(np.float32)
        confidences[metric] = np.where(np.isnan(values), rng.random((P, n, g), dtype=np.float32), values)
        confidences[metric][rng.random((P, n, g)) < 0.01] = np.nan
    return Record(continuation, lengths, rollout, confidences, (eos,), {"max_new_tokens": n, "topk": 5})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grid_totals_equal_simulation_on_random_records(seed):
    rec, g = random_record(seed), 7
    configs = [tiny.policy(metric=metric, schedule=schedule, threshold=t, threshold_start=t / 2,
                                            threshold_end=t, gamma_max=gamma, min_draft_len=m, max_new_tokens=40,
                                            semantics=semantics)
               for metric, schedule, t, gamma, m, semantics in itertools.product(
                   METRICS, GRID_SCHEDULES, (0.0, 0.25, 0.6, 1.0), (1, 4, g), (0, 2), SEMANTICS) if m <= gamma]
    cost = CostModel(t_draft=0.001, t_verify=[0.01 + 0.002 * k for k in range(g + 1)], context_tokens=10)
    grid = simulate_grid(rec, configs, cost)
    for config, row in zip(configs, grid.itertuples()):
        rounds = [r for prompt_rounds in simulate(rec, config) for r in prompt_rounds]
        assert (row.rounds, row.drafted_total, row.accepted_total, row.full_blocks, row.draft_forwards) == (
            len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds),
            sum(r.accepted == r.drafted for r in rounds), sum(r.draft_forwards for r in rounds)), config.label()
        assert row.emitted_total == sum(r.emitted for r in rounds) == rec.lengths.sum()
        assert row.predicted_speedup == pytest.approx(cost.predict(rounds, row.emitted_total))
    assert len(configs) > 300 and any(r.stop_reason == "eos" for c in configs[:20] for p in simulate(rec, c) for r in p)


def test_record_round_trips_and_refuses_other_models_or_prompts(recorded, tmp_path):
    _, rec = recorded
    rec.info.update(models={"target_fingerprint": "aaa", "draft_fingerprint": "bbb"}, prompts_fingerprint="ppp")
    rec.save(tmp_path)
    loaded = Record.load(tmp_path)
    assert np.array_equal(loaded.rollout, rec.rollout) and loaded.eos_ids == rec.eos_ids
    loaded.check_matches({"target_fingerprint": "aaa", "draft_fingerprint": "bbb"}, "ppp")
    with pytest.raises(DsparkError, match="another draft model"):
        loaded.check_matches({"target_fingerprint": "aaa", "draft_fingerprint": "zzz"}, "ppp")
    with pytest.raises(DsparkError, match="other prompts"):
        loaded.check_matches({"target_fingerprint": "aaa", "draft_fingerprint": "bbb"}, "qqq")
    with pytest.raises(DsparkError, match="no replay record"):
        Record.load(tmp_path / "missing")


def test_replay_refuses_what_it_cannot_replay(recorded):
    _, rec = recorded
    with pytest.raises(DsparkError, match="greedy"):
        simulate(rec, DecodeConfig.of(temperature=0.7, max_new_tokens=N))
    with pytest.raises(DsparkError, match="exceeds the record"):
        simulate_grid(rec, [DecodeConfig.of(gamma_max=G + 1, max_new_tokens=N)])
    short = CostModel(t_draft=0.001, t_verify=[0.01] * 3, context_tokens=10)
    with pytest.raises(DsparkError, match="up to 2 tokens, not gamma_max 4"):
        simulate_grid(rec, [DecodeConfig.of(gamma_max=4, max_new_tokens=N)], short)
    with pytest.raises(DsparkError, match="no policies"):
        simulate_grid(rec, [])


def test_a_depth_policy_replays_as_our_decoder_runs_it(llama_pair):
    """The depth schedule's round at (p, j) is its depth bucket's threshold policy's round there (depth:
    the prompt's tokens + j): on prompts whose output crosses depth 256, replay gives our decoder's rounds,
    round for round, under every engine rule; a grid, which walks one threshold per draft position,
    refuses it in one line that names simulate."""
    target, draft = llama_pair
    rng = np.random.default_rng(1)
    prompts = [[int(i) for i in rng.integers(2, tiny.VOCAB, n)] for n in (236, 250, 40)]
    n = 40
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    rec = record(pair, prompts, n, G, topk=5)
    configs = [DecodeConfig.of(schedule="depth", depth_policy=policy, metric=metric, min_draft_len=low,
                               semantics=semantics, max_new_tokens=n)
               for policy, metric, low, semantics in (("0/2,0.3/6", "top1", 1, "dspark"), ("0.6/6,0.1/3", "margin", 0,
                                                      "hf"), ("0.2/4,0.5/5", "top1", 2, "llamacpp"))]
    buckets = set()
    for config in configs:
        for prompt, rounds in zip(prompts, simulate(rec, config)):
            real = speculative_decode(pair.target, pair.draft, prompt, config).rounds
            assert [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens, r.target_token, r.draft_forwards)
                    for r in rounds] == [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens,
                                          r.target_token, r.draft_forwards) for r in real], config.label()
            depths = round_depths(len(prompt), [r.emitted for r in rounds])
            buckets |= set(depth_bucket(depths).tolist())
            for depth, r in zip(depths, rounds):  # each round within its own bucket's γ_max
                assert r.drafted <= at_depth(config, int(depth)).stopping.gamma_max
    assert buckets == {0, 1}
    # A grid walks a depth policy one at a time, in its place: its totals are simulate's rounds'.
    table = simulate_grid(rec, configs[:1])
    rounds = [r for prompt in simulate(rec, configs[0]) for r in prompt]
    assert (table["rounds"].iloc[0], table["drafted_total"].iloc[0], table["accepted_total"].iloc[0]) == (
        len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds))


def test_a_new_schedule_is_one_entry_in_the_registry(recorded, monkeypatch):
    """docs/architecture.md's example: a schedule added to schedules.SCHEDULES alone (a ramp on
    the running product) is a choice of every command, and the engine, on the host and on the
    device, and replay run it alike, its output the target's own."""
    from dspark_bench import schedules

    monkeypatch.setitem(schedules.SCHEDULES, "cumulative-ramp",
                        schedules.Schedule("cumulative-ramp", reads=("threshold_start", "threshold_end"),
                                           cumulative=True))
    pair, rec = recorded
    configs = [DecodeConfig.of(schedule="cumulative-ramp", threshold_start=start, threshold_end=0.6, gamma_max=G,
                               min_draft_len=low, max_new_tokens=N) for start, low in ((0.05, 0), (0.3, 1))]
    assert configs[0].label() == "top1 cumulative-ramp 0.05→0.6 γ≤6 min0"
    drafted = 0
    for config in configs:
        for prompt, rounds in zip(PROMPTS, simulate(rec, config)):
            for draft_mode in DRAFT_MODES:
                real = speculative_decode(pair.target, pair.draft, prompt, config.replace(draft_mode=draft_mode),
                                          pair.eos_ids)
                assert [(r.drafted, r.accepted, r.stop_reason) for r in rounds] == [
                    (r.drafted, r.accepted, r.stop_reason) for r in real.rounds], config.label()
                plain = autoregressive_decode(pair.target, prompt, config, pair.eos_ids).tokens
                assert real.tokens == plain
            drafted += sum(r.drafted for r in rounds)
    assert drafted > 0  # the rule let some drafts through
    with pytest.raises(DsparkError, match="unknown schedule 'cumulative-ramp'"):
        monkeypatch.delitem(schedules.SCHEDULES, "cumulative-ramp")
        DecodeConfig.of(schedule="cumulative-ramp")
