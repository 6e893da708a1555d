"""The gini confidence metric (Σ p², the complement of the Gini impurity): its values, the
engine's losslessness reading it, replay equal to the engine round for round, and the CLI."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tiny
import torch
from cli_helpers import invoke
from test_speculative import SMALL_VOCAB, chi_square_p, exact_first_two, sampled_first_two

from dspark_bench import schedules
from dspark_bench.config import METRICS, SCHEDULES, SEMANTICS, DecodeConfig
from dspark_bench.decoding import confidence, lookup, speculative
from dspark_bench.decoding.autoregressive import autoregressive_decode
from dspark_bench.decoding.host import fetch
from dspark_bench.measure.recording import record
from dspark_bench.replay.simulate import simulate

PROMPTS = [[0, 5, 9, 11], [7], [3, 3, 40, 2, 8, 100, 17]]
N, G = 24, 6
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def hand_gini(probs) -> np.ndarray:
    p = np.asarray(probs, dtype=np.float64)
    return (p * p).sum(axis=-1)


# --- values -----------------------------------------------------------------------------------


def test_gini_is_a_metric_a_signal_and_recorded():
    assert "gini" in METRICS and "gini" in confidence.SIGNALS
    assert confidence.SIGNALS["gini"] is confidence.gini
    # Records saved before gini stay loadable: they hold confidence.METRICS, which leaves it out.
    assert "gini" not in confidence.METRICS


@pytest.mark.parametrize("device", DEVICES)
def test_gini_on_known_distributions(device):
    V = 7
    one_hot = torch.zeros(V)
    one_hot[3] = 1.0
    uniform = torch.full((V,), 1.0 / V)
    hand = torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0, 0.0, 0.0])  # Σ p² = 0.25 + 0.0625 + 2 × 0.015625 = 0.34375
    probs = torch.stack([one_hot, uniform, hand]).to(device)
    expected = [1.0, 1.0 / V, 0.34375]
    for values in (confidence.gini(probs), confidence.all_metrics(probs)["gini"],
                   confidence.score(DecodeConfig.of(metric="gini"), probs)):
        assert values.device.type == device and values.shape == (3,)
        assert values.cpu().tolist() == pytest.approx(expected, abs=1e-6)
    # It is not any of the other metrics under another name.
    others = confidence.all_metrics(probs)
    for name in ("top1", "entropy", "topk_mass", "margin", "llamacpp_top1"):
        assert not torch.allclose(others[name], others["gini"]), name


@pytest.mark.parametrize("device", DEVICES)
def test_gini_device_and_host_paths_agree(device):
    """The engine's path: the device computes it (draft_signals), the host reads it through
    `fetch` and host_scores; it equals Σ p² computed on the host in float64, and the device's
    value equals the CPU's."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, 300, generator=gen) * 3.0
    probs = torch.softmax(logits, dim=-1)
    config = DecodeConfig.of(metric="gini")
    on_device = confidence.draft_signals(config, probs.to(device))  # [4, 5, 1]
    read = fetch(on_device.reshape(-1, 1))
    host = confidence.host_scores(config, read, None, [0] * len(read), [0] * len(read))
    assert host == pytest.approx(hand_gini(probs).reshape(-1).tolist(), rel=1e-5)
    assert confidence.gini(probs).reshape(-1).tolist() == pytest.approx(host, rel=1e-6)
    assert all(0.0 < h < 1.0 for h in host) and max(host) - min(host) > 0.01
    # Batched as the record computes it, every signal at once: the same values.
    assert torch.allclose(confidence.all_metrics(probs.to(device))["gini"].cpu(), confidence.gini(probs), rtol=1e-5)


def test_lookup_votes_give_gini():
    vocab = 50
    # One occurrence of a 1-gram: q(4) = 1/2, the other half spread over the 49 unvoted tokens.
    one = lookup.scores([(np.array([4]), np.array([1]), 1)], vocab, 5)
    assert one["gini"].item() == pytest.approx(0.25 + 49 * (0.5 / 49) ** 2, rel=1e-5)
    q = lookup.vote_distribution(np.array([4, 6]), np.array([3, 1]), 2, vocab)
    split = lookup.scores([(np.array([4, 6]), np.array([3, 1]), 2)], vocab, 5)
    assert split["gini"].item() == pytest.approx(hand_gini(q.numpy()), rel=1e-5)


# --- the engine reading it: lossless -------------------------------------------------------------


def gini_policies():
    # The tiny pair's gini values lie around 0.04-0.3 (vocabulary 300): these thresholds bind.
    for i, (schedule, threshold, (gamma_max, min_draft_len)) in enumerate(itertools.product(
            ("threshold", "cumulative", "ramp"), (0.08, 0.14), ((4, 0), (4, 1), (1, 0)))):
        yield tiny.policy(metric="gini", schedule=schedule, threshold=threshold, threshold_start=threshold / 2,
                          threshold_end=threshold, gamma_max=gamma_max, min_draft_len=min_draft_len,
                          max_new_tokens=N, semantics=SEMANTICS[i % len(SEMANTICS)])


@pytest.mark.parametrize("arch", ["llama_pair", "gpt2_pair"])
def test_greedy_with_gini_equals_target_greedy(arch, request):
    target, draft = request.getfixturevalue(arch)
    expected = {tuple(p): autoregressive_decode(target, p, DecodeConfig.of(max_new_tokens=N)).tokens for p in PROMPTS}
    reasons, accepted_any, rejected_any = set(), False, False
    for config in gini_policies():
        for prompt in PROMPTS:
            result = speculative.speculative_decode(target, draft, prompt, config)
            assert result.tokens == expected[tuple(prompt)], (config.label(), prompt)
            reasons |= {r.stop_reason for r in result.rounds}
            accepted_any |= any(r.accepted > 0 for r in result.rounds)
            rejected_any |= any(r.accepted < r.drafted for r in result.rounds)
    assert "threshold" in reasons and "gamma_max" in reasons  # the threshold binds, and not always
    assert accepted_any and rejected_any
    # The confidence the rule read is gini of the draft's own distribution at the first draft step.
    config = DecodeConfig.of(metric="gini", threshold=0.0, gamma_max=2, max_new_tokens=N)
    first = speculative.speculative_decode(target, draft, PROMPTS[0], config).rounds[0]
    with torch.inference_mode():
        q = torch.softmax(draft(torch.tensor([PROMPTS[0]])).logits[0, -1].float(), dim=-1)
    assert first.confidences[0] == pytest.approx(hand_gini(q.numpy()), rel=1e-5)


def test_sampling_with_gini_matches_target_distribution():
    """Rejection sampling stays lossless when gini cuts the draft (as for the suite's sampling test)."""
    target = tiny.llama(vocab=SMALL_VOCAB, seed=3)
    draft = tiny.llama(layers=1, vocab=SMALL_VOCAB, seed=4)
    prompt = [2, 4]
    # gini over 6 tokens lies in [1/6, 1]; this draft's second step reads 0.443 or 0.457 (after
    # its first token), so the threshold keeps one draft of two and cuts the other.
    config = DecodeConfig.of(metric="gini", temperature=1.0, top_p=0.9, threshold=0.45, gamma_max=3, max_new_tokens=3)
    lengths = {len(speculative.speculative_decode(target, draft, prompt, config.replace(seed=s)).rounds[0].draft_tokens)
               for s in range(40)}
    assert lengths == {1, 2}  # the threshold decides some rounds' length
    counts = sampled_first_two(target, draft, prompt, config, samples=1500)
    assert chi_square_p(counts, exact_first_two(target, prompt, config)) > 0.001


# --- replay ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(llama_pair):
    target, draft = llama_pair
    pair = SimpleNamespace(target=target, draft=draft, eos_ids=frozenset())
    return pair, record(pair, PROMPTS, N, G, topk=5)


@pytest.fixture(scope="module")
def gini_goodput_model(tmp_path_factory) -> str:
    """The suite's goodput model (tests/data) with an acceptance curve for gini, as a sweep now fits one."""
    model = json.loads(Path(tiny.GOODPUT_MODEL).read_text())
    curves = model["acceptance"]["curves"]
    curves["gini"] = {"x": [0.0, 0.2, 1.0], "y": [0.05, 0.6, 0.95]}  # a curve of its own, steep where gini lies
    path = tmp_path_factory.mktemp("goodput") / "goodput_model.json"
    path.write_text(json.dumps(model))
    return str(path)


@pytest.mark.parametrize("draft_mode", ["early-stop", "verify-side"])
def test_replay_with_gini_equals_our_decoder(recorded, draft_mode, gini_goodput_model):
    pair, rec = recorded
    assert set(confidence.SIGNALS) <= set(rec.confidences)
    compared, reasons = 0, set()
    configs = list(gini_policies()) + [
        DecodeConfig.of(metric="gini", schedule=s, threshold=0.1, threshold_start=0.05, threshold_end=0.2, gamma_max=G,
                        min_draft_len=0, max_new_tokens=N, depth_policy=f"0.1/{G}" if schedules.named(s).by_depth
                        else "", goodput_model=gini_goodput_model if schedules.named(s).cost_aware else "")
        for s in SCHEDULES if not schedules.named(s).controlled]  # its state runs on across prompts: test_controllers
    for config in configs:
        for prompt, rounds in zip(PROMPTS, simulate(rec, config)):
            real = speculative_decode_rounds(pair, prompt, config.replace(draft_mode=draft_mode))
            assert len(rounds) == len(real), config.label()
            for mine, theirs in zip(rounds, real):
                assert (mine.drafted, mine.accepted, mine.emitted, mine.stop_reason, mine.draft_tokens,
                        mine.target_token) == (theirs.drafted, theirs.accepted, theirs.emitted, theirs.stop_reason,
                                               theirs.draft_tokens, theirs.target_token), config.label()
                assert mine.confidences == pytest.approx(theirs.confidences[: len(mine.confidences)], abs=1e-5)
                reasons.add(mine.stop_reason)
                compared += 1
    assert "threshold" in reasons and compared > 100


def speculative_decode_rounds(pair, prompt, config):
    return speculative.speculative_decode(pair.target, pair.draft, prompt, config, pair.eos_ids).rounds


def test_replay_reads_the_recorded_gini(recorded):
    """Replay reads the record's gini, not another signal: overwrite it and the rounds change."""
    _, rec = recorded
    config = DecodeConfig.of(metric="gini", threshold=0.1, gamma_max=4, min_draft_len=0, max_new_tokens=N)
    before = [[r.drafted for r in p] for p in simulate(rec, config)]
    saved = rec.confidences["gini"]
    try:
        rec.confidences["gini"] = np.ones_like(saved)  # always sure: every draft runs to gamma_max
        after = [[r.drafted for r in p] for p in simulate(rec, config)]
    finally:
        rec.confidences["gini"] = saved
    assert before != after


def test_gini_has_its_held_out_row_in_the_signal_table(recorded):
    """The analysis' signal table holds gini beside the other raw metrics: its AUC is the raw
    value's own over the drafted tokens with a verdict, and a record made before gini shows the rest."""
    from dspark_bench.analysis.signal_quality import signal_quality
    from dspark_bench.replay.acceptance import roc_auc
    from dspark_bench.replay.learned import drafted

    _, rec = recorded
    rows = {row["signal"]: row for row in signal_quality(rec)}
    assert list(rows) == [*confidence.SIGNALS, "learned"]
    tokens = drafted(rec)
    assert rows["gini"]["auc"] == pytest.approx(roc_auc(tokens.raw["gini"], tokens.accepted))
    assert rows["gini"]["auc"] != rows["top1"]["auc"] and 0.0 < rows["gini"]["brier"] < 1.0
    saved = rec.confidences.pop("gini")  # as a record saved before gini holds them
    try:
        assert ([row["signal"] for row in signal_quality(rec)]
                == [s for s in (*confidence.SIGNALS, "learned") if s != "gini"])
    finally:
        rec.confidences["gini"] = saved


# --- the CLI -------------------------------------------------------------------------------------


def test_cli_run_with_gini(saved_pair, prompts_file, tmp_path):
    target, draft = saved_pair
    result = invoke("run", "--target", target, "--draft", draft, "--dataset", prompts_file, "--out", tmp_path,
                    "--metric", "gini", "--threshold", "0.1", "--gamma-max", "4", "--max-new-tokens", "8",
                    "--repeats", "1")
    assert result.exit_code == 0, result.output
    (folder,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    info = json.loads((folder / "run.json").read_text())
    assert [c["metric"] for c in info["configs"]] == ["gini"]
    import pandas as pd

    samples = pd.read_parquet(folder / "samples.parquet")
    assert samples["identical_to_baseline"].all() and len(samples) == 3
    assert not math.isnan(float(samples["new_tokens"].sum()))
