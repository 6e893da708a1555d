"""The engines' draft-length controllers (decoding/controllers.py): each chooses as the engine's own
code does, and replay runs it as our decoder does, its output the target's own."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml
from cli_helpers import invoke, one_error_line
from sglang.srt.speculative import adaptive_spec_params as adaptive  # SGLang's own controller (README's install)

from dspark_bench.config import DRAFT_MODES, DecodeConfig
from dspark_bench.decoding import controllers
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.batched import batched_speculative
from dspark_bench.decoding.speculative import speculative_decode
from dspark_bench.errors import DsparkError
from dspark_bench.measure.recording import record
from dspark_bench.replay.joint_walks import walk_controlled
from dspark_bench.replay.rounds import match_lengths
from dspark_bench.replay.simulate import simulate, simulate_grid
from dspark_bench.replay.slots import unpriced
from dspark_bench.replay.step_prices import StepPrices
from dspark_bench.reporting.controllers import controllers_figure
from dspark_bench.reporting.report_inputs import load_inputs

N, G = 40, 8
PROMPTS = [[0, 5, 9, 11], [7], [3, 3, 40, 2, 8, 100, 17], [12, 13], [50, 60, 70], [4, 4, 4, 4, 4]]


def sglang_settings(count: int, seed: int = 0) -> list[dict]:
    """SGLang's own default slots (batch sizes 1, 8, 32, 64) and `count` random knob settings."""
    settings = [{**entry, "candidate_steps": list(entry["candidate_steps"])}
                for entry in adaptive.DEFAULT_ADAPTIVE_CONFIG.values()]
    rng = random.Random(seed)
    for _ in range(count):
        settings.append({"candidate_steps": sorted(rng.sample(range(0, G + 1), rng.randint(1, 5))),
                         "ema_alpha": rng.choice([0.05, 0.2, 0.5, 1.0]), "update_interval": rng.randint(1, 6),
                         "warmup_batches": rng.randint(0, 12), "up_hysteresis": rng.choice([0.0, 0.25, -0.3]),
                         "down_hysteresis": rng.choice([0.0, -0.25, 0.3]), "ceiling_coeff": rng.choice([0, 1.0, 1.5])})
    return settings


def policy(setting: dict, **knobs) -> DecodeConfig:
    written = {**setting, "candidate_steps": ",".join(map(str, setting["candidate_steps"]))}
    return DecodeConfig.of(schedule="sglang-adaptive", **written, **knobs)


def theirs(setting: dict):
    """SGLang's slot as its server starts it: at --speculative-num-steps, by default the middle candidate."""
    steps = sorted(set(setting["candidate_steps"]))
    return adaptive.AdaptiveStepSlot(steps[len(steps) // 2], setting)


def test_adaptive_steps_choose_as_sglang_does_on_random_acceptance():
    """The same accepted counts, step by step, to SGLang's AdaptiveStepSlot and to ours: the same
    draft length at every one of 24,000 steps over 24 settings (SGLang's four default slots among them)."""
    rng = random.Random(1)
    steps = changes = 0
    for setting in sglang_settings(20):
        ours, slot = controllers.start(policy(setting)), theirs(setting)
        seen = []
        for _ in range(1000):
            k = ours.steps()
            assert k == slot.current_steps, setting
            accepted = [rng.randint(0, k) if rng.random() < 0.7 else rng.randint(0, max(k // 2, 0))
                        for _ in range(rng.randint(1, 8))]
            ours.observe(accepted, [k] * len(accepted))
            slot.update(accepted)
            seen.append(k)
            steps += 1
        changes += sum(a != b for a, b in zip(seen, seen[1:]))
    assert steps >= 20_000 and changes > 500  # the controllers moved, so agreeing means something


def test_sglang_shipped_slots_are_its_own():
    """controllers.shipped: at every batch size, the slot SGLang's own default config routes it to."""
    params = adaptive.AdaptiveSpeculativeParams(initial_steps=3)  # DEFAULT_ADAPTIVE_CONFIG, as a server loads it
    for batch_size in (1, 2, 7, 8, 9, 31, 32, 33, 64, 500):
        ours = controllers.shipped(DecodeConfig.of(schedule="sglang-adaptive", batch_size=batch_size,
                                                   ema_alpha=0.7)).stopping
        slot = params._route(batch_size)
        assert (list(controllers.lengths(DecodeConfig.of(schedule="sglang-adaptive",
                                                         candidate_steps=ours.candidate_steps))),
                ours.ema_alpha, ours.update_interval, ours.warmup_batches, ours.up_hysteresis, ours.down_hysteresis,
                ours.ceiling_coeff) == (slot.candidate_steps, slot.ema_alpha, slot.update_interval,
                                        slot.warmup_batches, slot.up_hysteresis, slot.down_hysteresis,
                                        slot.ceiling_coeff), batch_size


def trtllm(**knobs):
    return controllers.start(DecodeConfig.of(schedule="trtllm-schedule", **knobs))


def test_trtllm_schedule_and_gate_as_its_source_does():
    """TensorRT-LLM does not import on a CPU: vectors worked out from its source (docs/engine-controllers.md
    cites the files): the one-model path's lookup (a length up to its batch size, 0 above the last) and
    the SpeculationGate (the mean of the last `window` steps' Σ accepted / Σ drafted, checked once the
    window is full, strictly below the threshold switches drafting off for good)."""
    lookup = trtllm(draft_len_schedule="4:4,8:2,32:1")
    assert [lookup.steps(b) for b in (1, 2, 3, 4, 5, 8, 9, 32, 33, 100)] == [4, 4, 4, 4, 2, 2, 1, 1, 0, 0]
    assert [trtllm(draft_len_schedule="1:4,4:2,8:0").steps(b) for b in range(1, 11)] == [4, 2, 2, 2] + [0] * 6
    assert trtllm(gamma_max=3).steps(50) == 3  # no schedule: max_draft_len at every batch size

    def trips(window, threshold, rates):
        gate = trtllm(gamma_max=4, acceptance_rate_window_size=window, acceptance_rate_threshold=threshold)
        states = []
        for accepted, drafted in rates:
            gate.observe(accepted, drafted)
            states.append(gate.steps(1) == 0)
        return states

    tenths = [([round(r * 10)], [10]) for r in (0.9, 0.2, 0.5, 0.3, 0.6)]
    assert trips(3, 0.5, tenths) == [False, False, False, True, True]  # the mean of .2, .5, .3 is below .5
    quarters = [([3], [4]), ([2], [4]), ([1], [4]), ([1], [4])]
    assert trips(4, 0.5, quarters) == [False, False, False, True]  # 0.4375
    assert trips(3, 0.5, [([1], [2])] * 3) == [False] * 3  # equal to the threshold: on
    assert trips(0, 0.9, [([0], [4])] * 5) == [False] * 5  # window 0: no gate
    # One sample per step, token-weighted over its rows (5 / 10, not the rows' mean 0.57); a step that
    # drafted nothing records none.
    assert trips(2, 0.55, [([4, 0, 1], [4, 4, 2]), ([0], [0]), ([4, 0, 1], [4, 4, 2])]) == [False, False, True]


@pytest.fixture(scope="module")
def recorded(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    return pair, record(pair, PROMPTS, N, G, topk=5)


def test_adaptive_steps_choose_as_sglang_does_on_recorded_acceptance(recorded):
    """A replay of the record under each setting: SGLang's slot, fed each round's accepted count,
    chose every round's length (its drafted tokens, within the request's budget)."""
    _, rec = recorded
    rounds_checked = 0
    for setting in sglang_settings(16, seed=2):
        slot = theirs(setting)
        for rounds in simulate(rec, policy(setting, max_new_tokens=N)):
            j = 0
            for r in rounds:
                assert r.drafted == min(slot.current_steps, N - j - 1), setting
                slot.update([r.accepted])
                j += r.emitted
                rounds_checked += 1
    assert rounds_checked >= 2_000


CONTROLLED = [{"candidate_steps": [1, 3, 5, 7]},  # SGLang's slot for batch size 1, as it ships
              {"candidate_steps": [0, 1, 3], "warmup_batches": 0, "update_interval": 1, "down_hysteresis": 0.3},
              {"candidate_steps": [2, 4, 6], "ema_alpha": 1.0, "update_interval": 2, "warmup_batches": 1,
               "ceiling_coeff": 1.5}]


@pytest.mark.parametrize("draft_mode", DRAFT_MODES)
def test_replay_runs_a_controller_as_our_decoder_does(recorded, draft_mode):
    """Replay and our decoder, one controller running on across the prompts in order: the same rounds,
    round for round, and every output the target's own."""
    pair, rec = recorded
    lengths = set()
    for setting in CONTROLLED:
        config = policy(setting, max_new_tokens=N)
        state = None
        for prompt, rounds in zip(PROMPTS, simulate(rec, config)):
            real = speculative_decode(pair.target, pair.draft, prompt, config.replace(draft_mode=draft_mode),
                                      pair.eos_ids, controller=state)
            state = real.controller
            assert [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens, r.target_token)
                    for r in rounds] == [(r.drafted, r.accepted, r.emitted, r.stop_reason, r.draft_tokens,
                                          r.target_token) for r in real.rounds], config.label()
            assert real.tokens == autoregressive_decode(pair.target, prompt, config).tokens
            lengths |= {r.drafted for r in rounds}
    assert {0, 1, 3} <= lengths  # plain steps and several lengths were run
    table = simulate_grid(rec, [policy(CONTROLLED[1], max_new_tokens=N)])
    walked = [r for prompt in simulate(rec, policy(CONTROLLED[1], max_new_tokens=N)) for r in prompt]
    assert (table["rounds"].iloc[0], table["accepted_total"].iloc[0]) == (len(walked), sum(r.accepted for r in walked))


@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_batched_server_runs_one_controller_for_the_batch(recorded, batch_size):
    """At batch size B one controller sets every row's length each step, fed every row's acceptance:
    the output is the target's own, the length moved, and replay's walk of the same server
    (replay.joint_walks.walk_controlled) counts the decoder's rounds, drafts and acceptances."""
    pair, rec = recorded
    schedule = DecodeConfig.of(schedule="trtllm-schedule", draft_len_schedule="1:4,2:2,3:1", max_new_tokens=N,
                               batch_size=batch_size)  # its length follows the step's live rows
    for config in [policy(setting, max_new_tokens=N, batch_size=batch_size) for setting in CONTROLLED[1:]] + [schedule]:
        requests = batched_speculative(pair.target, pair.draft, PROMPTS, config, batch_size)
        for request, prompt in zip(requests, PROMPTS):
            assert request.result.tokens == autoregressive_decode(pair.target, prompt, config).tokens
        rounds = [r for q in requests for r in q.result.rounds]
        assert len({r.drafted for r in rounds}) >= 2
        zeros = np.zeros(len(PROMPTS))
        free = StepPrices.flat(np.zeros(batch_size + 1), np.zeros((batch_size + 1, G + 1)))
        walked = walk_controlled(rec, config, free, unpriced(len(zeros)),
                                 True, match_lengths(rec), zeros, zeros.copy(), zeros.copy())
        assert [walked[k] for k in ("rounds", "drafted_total", "accepted_total", "draft_forwards")] == [
            len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds),
            sum(r.draft_forwards for r in rounds)], config.label()


@pytest.mark.parametrize("knobs,message", [
    ({"ema_alpha": 0.0}, r"ema_alpha must be in \(0, 1\]"),
    ({"ema_alpha": 1.5}, r"ema_alpha must be in \(0, 1\]"),
    ({"candidate_steps": ""}, "candidate_steps is empty"),
    ({"candidate_steps": "1,-3"}, "negative draft length"),
    ({"candidate_steps": "1,x"}, "not a whole number"),
    ({"update_interval": 0}, "update_interval must be at least 1"),
    ({"batch_quorum": 0.5}, "drop the batch quorum"),
])
def test_bad_controller_knobs_are_refused_in_one_line(knobs, message):
    with pytest.raises(DsparkError, match=message) as refused:
        DecodeConfig.of(schedule="sglang-adaptive", **knobs)
    assert "\n" not in str(refused.value)


def test_a_controller_policy_built_from_a_few_knobs_reads_the_others_defaults():
    """from_dict hands Schedule.implied every knob: SGLang's default candidates (1,3,5,7) size gamma_max, and
    vLLM's table is capped at the default K (5) as vLLM clamps it, an all-K table written as none."""
    assert DecodeConfig.of(schedule="sglang-adaptive").stopping.gamma_max == 7
    table = DecodeConfig.of(schedule="vllm-adaptive", goodput_model="x",
                            num_speculative_tokens_per_batch_size="1-1:6,2-8:4").stopping
    assert (table.gamma_max, table.num_speculative_tokens_per_batch_size) == (5, "1-1:5,2-8:4")
    capped = DecodeConfig.of(schedule="vllm-adaptive", goodput_model="x", gamma_max=3,
                             num_speculative_tokens_per_batch_size="1-1:6,2-8:4").stopping
    assert capped.num_speculative_tokens_per_batch_size == ""


@pytest.fixture(scope="module")
def controller_sweep(saved_pair, prompts_file, tmp_path_factory):
    """A replay sweep with our threshold rule and the three controllers (each searching its own space, none
    of its knobs named), at B = 1 and 2 and under two loads."""
    target, draft = saved_pair
    out = tmp_path_factory.mktemp("controllers")
    result = invoke("sweep", "--target", target, "--draft", draft, "--dataset", str(prompts_file), "--out", out,
                    "--max-new-tokens", "24", "--threshold", "0.2", "--threshold", "0.6", "--gamma-max", "2",
                    "--gamma-max", "4", "--schedule", "threshold", "--schedule", "sglang-adaptive", "--schedule",
                    "trtllm-schedule", "--schedule", "vllm-adaptive", "--batch-size", "1", "--batch-size", "2",
                    "--arrival-rate", "50",
                    "--arrival-rate", "0.5", "--requests", "12", "--confirm-top", "2")
    assert result.exit_code == 0, result.output
    return next(p for p in out.iterdir() if "sweep" in p.name), result.output


def test_a_sweep_sets_each_controller_beside_fixed_and_ours(controller_sweep):
    """Per batch size and per load: each controller at its engine's defaults and tuned (its best in its own
    space), the best fixed γ and our best; the controllers' rows timed by the confirm stage; each controller's
    steps for the report's figure."""
    folder, output = controller_sweep
    section = json.loads((folder / "summary.json").read_text())["controllers"]
    trials = pd.read_parquet(folder / "trials.parquet")
    assert [b["batch_size"] for b in section["by_batch"]] == [1, 2]
    for batch in section["by_batch"]:
        here = trials[trials["batch_size"] == batch["batch_size"]]
        rows = {r["role"]: r for r in batch["rows"]}
        assert {"sglang-adaptive · its defaults", "sglang-adaptive · tuned", "best fixed γ", "our best"} <= set(rows)
        assert any(role.startswith("trtllm-schedule · tuned") for role in rows)
        assert any(role.startswith("vllm-adaptive · tuned") for role in rows)
        vllm = here[here["schedule"] == "vllm-adaptive"]  # its tables at each K, on the sweep's own step costs
        # its 4 tables at K = 2 and 4, one at K = 2 every batch size at K (no table): 7
        assert len(vllm) == 7 and set(vllm["goodput_model"]) == {str((folder / "goodput_model.json").resolve())}
        own = here[here["schedule"] == "sglang-adaptive"]
        assert len(own) > 100  # its own space was searched
        assert rows["sglang-adaptive · tuned"]["predicted_speedup"] == pytest.approx(own["predicted_speedup"].max())
        assert rows["best fixed γ"]["predicted_speedup"] == pytest.approx(
            here.loc[here["schedule"] == "fixed", "predicted_speedup"].max())
        shipped = rows["sglang-adaptive · its defaults"]["config_label"]
        assert "1/3/5/7 α0.2 every5 warm10 ↑0 ↓-0.25 ceil0" in shipped  # SGLang's slot for batch sizes 1 to 7
        assert all(rows[role].get("speedup") is not None for role in rows)  # every row timed by our decoder
    assert [rate["arrival_rate"] for rate in section["by_rate"]] == [0.5, 50.0]
    assert all(len(rate["rows"]) >= 4 for rate in section["by_rate"])
    steps = pd.read_parquet(folder / section["table"])
    assert set(steps["batch_size"]) == {1, 2} and steps["length"].nunique() >= 2
    assert "the engines' controllers beside fixed γ and our best" in output
    fig, caption = controllers_figure(load_inputs([folder]))
    assert len(fig.axes) == 4 and "length each engine controller picks" in caption


@pytest.mark.parametrize("slots", [("1,3,5,7", "1,2,3,4"), ("1,2,3,4", "0,1,3"), ("0,1,3", "2,4,6,8")])
def test_sglang_starts_every_exported_slot_where_our_replay_starts_it(slots, tmp_path):
    """SGLang starts each slot at --speculative-num-steps where the slot has that length, at its middle
    otherwise; ours at its middle: the export picks the number where the two agree for every slot."""
    from types import SimpleNamespace

    from dspark_bench.engines.files import sglang_slots, sglang_start

    choices = [SimpleNamespace(batch_size=b, exported=DecodeConfig.of(schedule="sglang-adaptive",
                                                                      candidate_steps=steps))
               for b, steps in zip((1, 8), slots)]
    (tmp_path / "slots.json").write_text(json.dumps(sglang_slots(choices)))
    params = adaptive.AdaptiveSpeculativeParams(sglang_start(choices), str(tmp_path / "slots.json"))
    for choice in choices:
        assert params.get_steps_for_batch(choice.batch_size) == controllers.start(choice.exported).steps()


def test_export_writes_each_controller_in_its_engine_s_own_words(controller_sweep, tmp_path, monkeypatch):
    """export --controller: SGLang's adaptive config (a slot per batch size) read by SGLang's own loader,
    whose slots then pick as ours do; TensorRT-LLM's keys; a version without the controller gets the nearest
    fixed length and a line saying why; an engine without one is refused in one line."""
    folder, _ = controller_sweep
    result = invoke("export", folder, "--format", "sglang", "--controller", "--out", tmp_path / "sglang")
    assert result.exit_code == 0, result.output
    monkeypatch.chdir(tmp_path / "sglang")  # the config names its slots' file beside it
    from sglang.srt.server_args import prepare_server_args  # SGLang's own parser

    parsed = prepare_server_args(["--model-path", "target", "--config", "sglang_config.yaml"])
    assert parsed.speculative_adaptive and parsed.speculative_adaptive_config == "sglang_adaptive.json"
    params = adaptive.AdaptiveSpeculativeParams(parsed.speculative_num_steps, "sglang_adaptive.json")
    slots = json.loads(Path("sglang_adaptive.json").read_text())
    assert sorted(map(int, slots)) == [1, 2]  # a slot per batch size swept
    trials = pd.read_parquet(folder / "trials.parquet")
    rng = random.Random(3)
    for key, slot in slots.items():
        batch_size = int(key)  # ours, from the slot's own knobs as written: one of the run's controllers at B
        written = {**slot, "candidate_steps": ",".join(map(str, slot["candidate_steps"]))}
        tuned = trials[(trials["batch_size"] == batch_size) & (trials["schedule"] == "sglang-adaptive")]
        assert any(all(row[k] == v for k, v in written.items()) for _, row in tuned.iterrows()), slot
        ours = controllers.start(DecodeConfig.of(schedule="sglang-adaptive", **{
            k: v for k, v in slot.items() if k != "candidate_steps"}, candidate_steps=",".join(
            map(str, slot["candidate_steps"]))))
        for _ in range(300):
            k = ours.steps()
            assert k == params.get_steps_for_batch(batch_size), key
            accepted = [rng.randint(0, k) for _ in range(batch_size)]
            ours.observe(accepted, [k] * batch_size)
            params.on_verify_complete(accepted, batch_size)
    result = invoke("export", folder, "--format", "trtllm", "--controller", "--out", tmp_path / "trtllm")
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((tmp_path / "trtllm" / "trtllm_speculative.yaml").read_text())["speculative_config"]
    assert written["decoding_type"] == "Draft_Target" and written["max_draft_len"] >= 1
    old = invoke("export", folder, "--format", "sglang", "--controller", "--engine-version", "0.5.12", "--out",
                 tmp_path / "old")
    assert old.exit_code == 0 and "cannot express the sglang-adaptive controller as replayed" in old.output
    assert "speculative-adaptive" not in (tmp_path / "old" / "sglang_config.yaml").read_text()
    result = invoke("export", folder, "--format", "vllm", "--controller", "--out", tmp_path / "vllm")
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "vllm" / "speculative_config.json").read_text())
    assert written["enable_adaptive_verification"] is True
    table = written["num_speculative_tokens_per_batch_size"]  # each B's tuned K, as vLLM's table keeps it
    assert [entry[0] for entry in table] == [1, 2] and all(1 <= k <= written["num_speculative_tokens"]
                                                           for _, _, k in table)
    old = invoke("export", folder, "--format", "vllm", "--controller", "--engine-version", "0.33.0", "--out",
                 tmp_path / "vllm-old")
    assert old.exit_code == 0 and "cannot express the vllm-adaptive controller as replayed" in old.output
    assert "adaptive" not in (tmp_path / "vllm-old" / "speculative_config.json").read_text()
    refused = invoke("export", folder, "--format", "hf", "--controller", "--out", tmp_path / "hf")
    assert refused.exit_code == 1 and "hf has no draft-length controller" in one_error_line(refused)


def served_and_replayed(config: DecodeConfig, first_seed: int):
    """On the Markov pair (tiny.markov_llama), at `config`'s temperature: our decoder's rounds, the
    controller run on across streams of sampled.DRAWS requests (a replicate is each coin draw of one path
    in turn: replay/sampled.replicates, so the decoder serves groups of as many requests, one controller a
    group), and (real, replayed): the mean rounds, drafts and acceptances per request of each."""
    import tiny
    from test_sampled_replay import P, Q

    from dspark_bench.measure import sampled_recording
    from dspark_bench.replay import sampled

    models = SimpleNamespace(target=tiny.markov_llama(P), draft=tiny.markov_llama(Q), eos_ids=frozenset())
    decodes = []
    for group in range(400):  # a stream of sampled.DRAWS requests, one controller running on through it
        state = None
        for turn in range(sampled.DRAWS):
            result = speculative_decode(models.target, models.draft, [0], config.replace(
                seed=first_seed + sampled.DRAWS * group + turn), controller=state)
            decodes.append(result.rounds)
            state = result.controller
    real = np.mean([[len(r), sum(x.drafted for x in r), sum(x.accepted for x in r)] for r in decodes], axis=0)
    rec = sampled_recording.record_sampled(models, [[0]], config, 3, paths=400, eos_ids=frozenset())
    table = sampled.expected([simulate_grid(r, [config]) for r in sampled.replicates(rec)])
    sequences = len(rec.lengths) * rec.info["sampling"]["draws"]
    return decodes, real, table[["rounds", "drafted_total", "accepted_total"]].to_numpy()[0] / sequences


def test_a_controller_replayed_from_a_sampled_record_is_the_real_process_in_expectation():
    """At temperature 0.5 on the Markov pair: our decoder with SGLang's controller and replay of a sampled
    record give the same expected rounds, drafts and acceptances (within 5 %), the controller run on across
    the same streams of requests (served_and_replayed); the length moved."""
    config = policy({"candidate_steps": [1, 2, 3], "ema_alpha": 0.5, "update_interval": 1, "warmup_batches": 0},
                    max_new_tokens=8, temperature=0.5)
    decodes, real, replayed = served_and_replayed(config, 20_000)
    assert np.allclose(real, replayed, rtol=0.05), (real, replayed)
    assert len({x.drafted for r in decodes for x in r}) >= 2


@pytest.mark.parametrize("flags,message", [
    (["--schedule", "sglang-adaptive", "--ema-alpha", "0"], r"ema_alpha must be in \(0, 1\]"),
    (["--schedule", "sglang-adaptive", "--candidate-steps", "3,-1"], "negative draft length"),
    (["--schedule", "sglang-adaptive", "--candidate-steps", " "], "candidate_steps is empty"),
    (["--schedule", "trtllm-schedule", "--draft-len-schedule", "4:2,8:4"], "smallest batch size's length"),
    (["--schedule", "sglang-adaptive", "--set", "ema_beta=0.3"], "ema_beta"),
    (["--ema-alpha", "0.5"], "--ema-alpha has no effect here"),
    (["--schedule", "vllm-adaptive", "--num-speculative-tokens-per-batch-size", "2-8:3"], "must start at 1"),
    (["--schedule", "vllm-adaptive", "--evaluation", "real"], "budgets with the step costs a replay sweep measures"),
])
def test_a_bad_controller_knob_ends_a_sweep_in_one_line_before_any_work(flags, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "earlier.txt").write_text("an earlier result")
    result = invoke("sweep", "--task", "code", *flags, "--out", tmp_path / "out")
    assert result.exit_code == 1, result.output
    assert re.search(message, one_error_line(result))
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["earlier.txt"]  # nothing written, nothing lost
