"""In-decode costs (measure/pass_clock.py, measure/in_decode.py): every pass of a running decode
timed where it runs, rounds and their overhead, and the cost model they imply."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from dspark_bench.config import DecodeConfig
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.measure import pass_clock
from dspark_bench.measure.cost_model import chain_line, measure_cost
from dspark_bench.measure.in_decode import cost_from, measure_in_decode
from dspark_bench.replay.cost import CostModel

CPU = torch.device("cpu")
PROMPT = [5, 9, 2, 7, 11, 3, 8]


@pytest.mark.parametrize("config", [DecodeConfig.of(threshold=0.3, gamma_max=4, max_new_tokens=30),
                                    DecodeConfig.of(schedule="fixed", gamma_max=3, max_new_tokens=30)])
def test_every_pass_of_every_round_is_timed(llama_pair, config):
    target, draft = llama_pair
    start = time.perf_counter()
    with pass_clock.timing(CPU) as timing:
        result = speculative_decode(target, draft, PROMPT, config, clock=timing)
    wall = time.perf_counter() - start
    assert len(timing.rounds) == len(result.rounds)
    # the prefills are not a round's passes; each round: its draft steps and one verify of k + 1
    verify = sorted(tokens for role, tokens, _ in timing.passes if role == "target")
    assert verify == sorted(r.drafted + 1 for r in result.rounds)
    drafts = [tokens for role, tokens, _ in timing.passes if role == "draft"]
    assert len(drafts) == sum(r.draft_forwards for r in result.rounds) and set(drafts) <= {1, 2}
    assert all(total >= passes > 0 for total, passes, _ in timing.rounds)  # a round holds its passes
    assert [drafts for _, _, drafts in timing.rounds] == [r.draft_forwards for r in result.rounds]
    assert 0 < sum(total for total, _, _ in timing.rounds) < wall
    assert timing.overhead() >= 0 and not timing.marks


def test_plain_decoding_is_a_round_per_token(llama_pair):
    target, _ = llama_pair
    config = DecodeConfig.of(max_new_tokens=12)
    with pass_clock.timing(CPU) as timing:
        result = autoregressive_decode(target, PROMPT, config, clock=timing)
    assert len(timing.rounds) == len(result.tokens) == 12
    assert [(role, tokens) for role, tokens, _ in timing.passes] == [("target", 1)] * 12


def test_a_decode_given_no_clock_times_nothing(llama_pair):
    """The clock is the decode's argument, not a module's state: a decode run inside a timing
    block without it leaves the block's clock empty, and two clocks time two decodes apart."""
    target, _ = llama_pair
    config = DecodeConfig.of(max_new_tokens=3)
    with pass_clock.timing(CPU) as idle, pass_clock.timing(CPU) as timing:
        autoregressive_decode(target, PROMPT, config)  # no clock: nothing kept
        autoregressive_decode(target, PROMPT, config, clock=timing)
    assert idle.rounds == [] and idle.passes == []
    assert len(timing.rounds) == 3


class FakeEvent:
    """torch.cuda.Event's timing part: record() stamps the clock, elapsed_time is milliseconds."""

    def __init__(self, enable_timing: bool):
        assert enable_timing
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.at - self.at) * 1e3


def test_on_cuda_marks_are_events_read_once_at_the_end(monkeypatch):
    """The CUDA branch on a CPU: marks are events (never a sync inside the block), settled in
    seconds by a single synchronize when the block ends."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    with pass_clock.timing(torch.device("cuda")) as timing:
        timing.round_starts()
        start = timing.before_pass()
        time.sleep(0.02)
        timing.after_pass(start, "target", 3)
        time.sleep(0.01)
        timing.decode_ends()
        assert syncs == [] and isinstance(start, FakeEvent)
    assert len(syncs) == 1
    ((role, tokens, seconds),) = timing.passes
    assert (role, tokens) == ("target", 3) and 0.02 <= seconds < 0.2
    ((total, passes, drafts),) = timing.rounds
    assert drafts == 0
    assert passes == seconds and total - passes >= 0.01


def test_the_overhead_fit_never_goes_below_zero():
    falling = timing_of([], [(5.0, 3.0, 1), (5.0, 3.5, 4)])  # more steps, less past the passes
    assert falling.overhead_fit() == (pytest.approx(1.75), 0.0)
    steep = timing_of([], [(1.0, 1.0, 1), (4.0, 1.0, 3)])  # a line through a < 0: through the origin instead
    a, b = steep.overhead_fit()
    assert a == 0.0 and b == pytest.approx(3.0 * 3 / 10)
    assert timing_of([], [(2.0, 1.0, 2), (3.0, 1.0, 2)]).overhead_fit() == (1.5, 0.0)  # one step count: per round


def timing_of(passes, rounds) -> pass_clock.Timing:
    timing = pass_clock.Timing(CPU)
    timing.passes, timing.rounds = passes, rounds
    return timing


def test_the_cost_model_takes_what_the_decodes_measured():
    isolated = CostModel(t_draft=1.0, t_verify=[2.0, 2.2, 2.4, 2.6], context_tokens=100)
    spec = timing_of([("draft", 1, 0.5), ("draft", 1, 0.7), ("draft", 1, 0.6), ("draft", 2, 0.9),
                      ("target", 2, 3.0), ("target", 2, 3.4), ("target", 2, 3.2), ("target", 4, 3.9),
                      ("target", 4, 3.8), ("target", 4, 4.0), ("target", 3, 9.9)],  # k = 2 fed once: not enough
                     [(5.0, 4.0, 1), (6.25, 4.5, 2), (7.5, 5.0, 3)])  # past the passes: 1.0, 1.75, 2.5
    plain = timing_of([("target", 1, 1.8)] * 3, [(2.0, 1.8, 0), (2.1, 1.8, 0), (1.9, 1.8, 0)])
    model, detail = cost_from(spec, plain, isolated)
    # 1.0, 1.75, 2.5 over 1, 2, 3 draft steps: 0.25 a round and 0.75 a step, a step's added to its pass
    assert model.t_round == pytest.approx(0.25) and detail["per_step_overhead"] == pytest.approx(0.75)
    assert model.t_draft == pytest.approx(0.6 + 0.75) and detail["draft_pass"] == 0.6
    assert detail["catch_up_draft"] == 0.9  # the 2-token catch-up kept apart
    assert model.t_verify[1] == 3.2 and model.t_verify[3] == 3.9  # k = 1 and k = 3 were fed
    scale = (3.2 / 2.2 + 3.9 / 2.6) / 2  # the median of the seen ones' ratios to their isolated prices
    assert model.t_verify[0] == pytest.approx(2.0 * scale) and model.t_verify[2] == pytest.approx(2.4 * scale)
    assert detail["median_round_overhead"] == 1.75
    assert model.t_plain == 2.0 and model.plain_step == 2.0
    assert detail["verify_passes"] == {1: 3, 3: 3} and detail["rounds"] == 3


def test_a_rounds_first_draft_pass_is_kept_apart(llama_pair):
    """Every one-token draft pass is an opener (its round's first) or a follower, as the round ran it."""
    target, draft = llama_pair
    config = DecodeConfig.of(schedule="fixed", gamma_max=3, max_new_tokens=30)
    with pass_clock.timing(CPU) as timing:
        result = speculative_decode(target, draft, PROMPT, config, clock=timing)
    ones = [seconds for role, tokens, seconds in timing.passes if (role, tokens) == ("draft", 1)]
    assert sorted(timing.openers + timing.followers) == sorted(ones)
    opened_by_one = sum(r.draft_forwards > 0 for r in result.rounds) - sum(
        tokens == 2 for role, tokens, _ in timing.passes if role == "draft")  # a catch-up pass opens its round
    assert len(timing.openers) == opened_by_one > 0 and len(timing.followers) > 0


def test_a_rounds_first_draft_pass_is_priced_once_a_round():
    """With openers and followers seen, a draft step is priced at the followers' median and the
    openers' excess over it goes to every round of the draft model's (t_first_draft), not the heads'
    or the lookup's: a long draft is not priced as first steps."""
    isolated = CostModel(t_draft=1.0, t_verify=[2.0, 2.2, 2.4, 2.6], context_tokens=100)
    spec = timing_of([("draft", 1, 0.5)] * 6 + [("target", 2, 3.0)] * 3,
                     [(5.0, 4.0, 1), (6.25, 4.5, 2), (7.5, 5.0, 3)])  # past the passes: 0.25 a round, 0.75 a step
    spec.openers, spec.followers = [1.4, 1.5, 1.3], [0.9, 1.0, 1.1, 0.95]
    plain = timing_of([("target", 1, 1.8)] * 3, [(2.0, 1.8, 0)] * 3)
    model, detail = cost_from(spec, plain, isolated)
    assert model.t_draft == pytest.approx(0.975 + 0.75) and detail["draft_pass"] == pytest.approx(0.975)
    assert model.t_round == pytest.approx(0.25) and detail["first_draft_excess"] == pytest.approx(0.425)
    assert model.t_first_draft == pytest.approx(0.425)
    assert model.round_costs("model")[1] == pytest.approx(model.t_verify[1] + 0.25 + 0.425)
    assert model.round_costs("heads")[1] == pytest.approx(model.t_verify[1] + 0.25) == model.round_costs("lookup")[1]
    spec.openers = spec.openers[:2]  # too few to tell apart: every one-token pass's median, no excess
    model, detail = cost_from(spec, plain, isolated)
    assert model.t_draft == pytest.approx(0.5 + 0.75) and model.t_round == pytest.approx(0.25)
    assert model.t_first_draft == 0


def test_measure_in_decode_on_real_decodes(llama_pair):
    target, draft = llama_pair
    pair = type("Pair", (), {"target": target, "draft": draft, "device": CPU})()
    isolated = CostModel(t_draft=1.0, t_verify=[1.0] * 5, context_tokens=8)
    configs = [DecodeConfig.of(schedule="fixed", gamma_max=g, max_new_tokens=16) for g in (2, 4)]
    model, detail = measure_in_decode(pair, [PROMPT, PROMPT[:4]], configs, isolated)
    assert set(detail["verify_passes"]) >= {2, 4} and detail["plain_steps"] == 2 * 32  # 2 repeats × 2 prompts × 16
    assert 0 < model.t_draft < 0.5 and model.t_round >= 0 and model.t_plain >= detail["plain_pass"] > 0


def test_chain_line_prices_a_rounds_draft_steps_as_a_first_step_and_the_rest():
    """measure_cost's draft steps timed in turn after the target's pass: a first step dearer than
    the rest by a fixed excess is read back exactly; a warm-up over several steps (the shipped
    pair's on this CPU) is priced at the first step's own timing and within 0.3 ms of every later
    running sum, where one price a step (the first's) was 3.3 ms over at six; no step dearer than
    the later ones: their median, no excess."""
    assert chain_line([1.5, 0.5, 0.5, 0.5, 0.5, 0.5]) == pytest.approx((0.5, 1.0))
    warm_up = [1.3, 0.95, 0.70, 0.55, 0.50, 0.49]
    t_draft, first = chain_line(warm_up)
    assert 0.5 < t_draft < 0.7 and first > 0
    assert first + t_draft == pytest.approx(warm_up[0])  # a batched walk's every step: the first's timing
    for s, total in enumerate(np.cumsum(warm_up), start=1):
        assert abs(first + s * t_draft - total) < 0.3
    assert 6 * warm_up[0] - sum(warm_up) > 3.3
    assert chain_line([0.5, 0.52, 0.49, 0.5]) == pytest.approx((0.5, 0.0), abs=0.01)  # flat: next to no excess
    assert chain_line([0.4, 0.5, 0.6]) == (pytest.approx(0.5), 0.0)  # dearer later: no first-step excess
    assert chain_line([0.7]) == (0.7, 0.0)


def test_measure_cost_times_a_rounds_draft_steps_in_turn(llama_pair):
    """The isolated batch-1 model prices a draft step and a round's first step's excess from steps
    timed one after another, as a round drafts them: its first step costs no less than a later one."""
    target, draft = llama_pair
    pair = type("Pair", (), {"target": target, "draft": draft, "device": CPU})()
    model = measure_cost(pair, PROMPT, 4, repeats=3)
    assert model.t_draft > 0 and model.t_first_draft >= 0 and len(model.t_verify) == 5
    assert CostModel.from_dict(model.to_dict()) == model
