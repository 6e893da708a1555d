"""Replay under sampling (replay/sampled.py): exact in distribution.

A 3-token Markov pair gives speculative sampling's exact expectations by enumeration of the real
process (written here from the rejection rule, independently of replay); a sampled record built
from the same pair must replay them, and the two wrong replays the argument rules out (the draft
after a rejection taken from the path; acceptance read as min(1, p/q)) must not."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from dspark_bench.config import DecodeConfig
from dspark_bench.errors import DsparkError
from dspark_bench.measure import sampled_recording
from dspark_bench.replay import sampled
from dspark_bench.replay.simulate import simulate_grid

# Rows: the previous token; columns: the next one. The draft is sure after token 0, unsure after 1.
P = np.array([[0.6, 0.3, 0.1], [0.2, 0.3, 0.5], [0.1, 0.2, 0.7]])
Q = np.array([[0.85, 0.1, 0.05], [0.4, 0.35, 0.25], [0.05, 0.05, 0.9]])
N, G = 5, 3  # tokens per sequence, the deepest draft
POLICIES = [dict(threshold=0.5, gamma_max=3, min_draft_len=0), dict(threshold=0.5, gamma_max=2, min_draft_len=1),
            dict(schedule="fixed", gamma_max=3, min_draft_len=0)]


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    r = np.clip(p - q, 0, None)
    return r / r.sum() if r.sum() > 0 else p


# What a rejected draft token is distributed as, after each context: norm(max(q - p, 0)).
REJECTED = np.stack([residual(Q[c], P[c]) for c in range(3)])


class Exact:
    """Speculative sampling's exact expectations on a Markov pair (target P, draft Q [3, 3]) over
    `n` new tokens, by enumerating the real process (written from the rejection rule,
    independently of replay)."""

    def __init__(self, p: np.ndarray, q: np.ndarray, n: int = N):
        self.p, self.q, self.n = p, q, n
        self.sums = functools.lru_cache(maxsize=None)(self._sums)

    def __call__(self, policy: dict) -> np.ndarray:
        """Expected (rounds, drafted, accepted) per sequence of `policy` from the token 0."""
        return self.sums(0, 0, policy.get("threshold", 0.0), policy["gamma_max"], policy["min_draft_len"])

    def _sums(self, i: int, prev: int, threshold: float, gamma_max: int, min_draft_len: int) -> np.ndarray:
        """Expected (rounds, drafted, accepted) from i tokens generated after `prev`: the draft
        samples from Q while its top-1 is at least the threshold (or within min_draft_len), up to
        min(gamma_max, n - i - 1) tokens; the target accepts x with probability min(1, p(x)/q(x)),
        draws a correction from norm(max(p - q, 0)) at the first rejection, else a bonus from p."""
        if i >= self.n:
            return np.zeros(3)
        P, Q, total = self.p, self.q, np.zeros(3)
        rest = functools.partial(self.sums, threshold=threshold, gamma_max=gamma_max, min_draft_len=min_draft_len)
        for drafted, chance in self.drafts(prev, min(gamma_max, self.n - i - 1), threshold, min_draft_len):
            ctx, alive = prev, chance
            for k, x in enumerate(drafted):
                keep = min(1.0, P[ctx, x] / Q[ctx, x])
                for z in range(3):  # rejected at k: the correction z
                    w = alive * (1 - keep) * residual(P[ctx], Q[ctx])[z]
                    if w > 0:
                        total += w * (np.array([1, len(drafted), k]) + rest(i + k + 1, z))
                alive *= keep
                ctx = x
            for z in range(3):  # every drafted token accepted: the bonus z
                w = alive * P[ctx, z]
                if w > 0:
                    total += w * (np.array([1, len(drafted), len(drafted)]) + rest(i + len(drafted) + 1, z))
        return total

    def drafts(self, prev: int, limit: int, threshold: float, min_draft_len: int):
        """Every draft the policy can make from `prev`, with its probability."""
        out, done = [((), 1.0)], []
        while out:
            tokens, chance = out.pop()
            ctx = tokens[-1] if tokens else prev
            if len(tokens) == limit or (self.q[ctx].max() < threshold and len(tokens) + 1 > min_draft_len):
                done.append((tokens, chance))
                continue
            out += [(tokens + (x,), chance * self.q[ctx, x]) for x in range(3) if self.q[ctx, x] > 0]
        return done


exact = Exact(P, Q)


def markov_record(rows: int, seed: int, wrong: str = "") -> sampled.SampledRecord:
    """A sampled record of the Markov pair, built as record_sampled builds one from models:
    paths from P, p and q of each path token, the rejected token from the residual and the
    draft's sampled rollout after it. `wrong`: "path" rolls the draft out along the path after a
    rejection; "ratio" stores p and q swapped, so that acceptance reads min(1, p/q)."""
    rng = np.random.default_rng(seed)

    def sample(dist: np.ndarray) -> np.ndarray:  # one token per row of [R, 3]
        return (rng.random(len(dist))[:, None] > dist.cumsum(axis=1)).sum(axis=1)

    paths = np.zeros((rows, N), dtype=np.int64)
    prev = np.zeros(rows, dtype=np.int64)
    for m in range(N):
        paths[:, m] = sample(P[prev])
        prev = paths[:, m]
    before = np.concatenate([np.zeros((rows, 1), dtype=np.int64), paths[:, :-1]], axis=1)
    p_token, q_token = P[before, paths], Q[before, paths]
    rollout = np.zeros((rows, N, G), dtype=np.int64)
    top1 = np.zeros((rows, N, G), dtype=np.float32)
    for m in range(N):
        ctx = before[:, m]
        top1[:, m, 0] = Q[ctx].max(axis=1)
        rollout[:, m, 0] = sample(REJECTED[ctx])
        for s in range(1, G):
            if wrong == "path":
                ctx = paths[:, min(m + s - 1, N - 1)]
                rollout[:, m, s] = paths[:, min(m + s, N - 1)]
            else:
                ctx = rollout[:, m, s - 1]
                rollout[:, m, s] = sample(Q[ctx])
            top1[:, m, s] = Q[ctx].max(axis=1)
    if wrong == "ratio":
        p_token, q_token = q_token, p_token
    info = {"max_new_tokens": N, "gamma_record": G, "topk": 5, "drafter": {"drafter": "model"},
            "sampling": {"temperature": 1.0, "top_p": 1.0, "seed": seed, "paths": 4, "draws": 2},
            "prompt_tokens": [1] * rows}
    return sampled.SampledRecord(paths, np.full(rows, N), p_token, q_token, rollout, {"top1": top1}, (), info)


def per_sequence(rec: sampled.SampledRecord, policy: dict, temperature: float = 1.0, top_p: float = 1.0) -> np.ndarray:
    config = DecodeConfig.of(max_new_tokens=N, temperature=temperature, top_p=top_p, **policy)
    table = sampled.expected([simulate_grid(r, [config]) for r in sampled.replicates(rec)])
    sequences = len(rec.lengths) * rec.info["sampling"]["draws"]
    return table[["rounds", "drafted_total", "accepted_total"]].to_numpy()[0] / sequences


@pytest.fixture(scope="module")
def records():
    return {wrong: markov_record(16_000, 1, wrong) for wrong in ("", "path", "ratio")}


@pytest.mark.parametrize("policy", POLICIES, ids=["threshold", "min_draft_len", "fixed"])
def test_replay_of_a_sampled_record_is_the_real_process_in_expectation(policy, records):
    truth = exact(policy)
    replayed = per_sequence(records[""], policy)
    # 16,000 paths × 2 coin draws: the per-sequence means' standard errors are under 0.3 %.
    assert np.allclose(replayed, truth, rtol=0.012), (replayed, truth)


def test_the_wrong_replays_fail_the_same_check(records):
    """Off by more than the tolerance on at least one policy and metric, each of them."""
    for wrong in ("path", "ratio"):
        off = []
        for policy in POLICIES:
            truth = exact(policy)
            off.append(np.abs(per_sequence(records[wrong], policy) / truth - 1).max())
        assert max(off) > 0.03, (wrong, off)


def test_a_record_sampled_otherwise_is_refused_in_one_line(records):
    rec = records[""]
    for changes in (dict(temperature=0.7), dict(temperature=1.0, top_p=0.9), dict(temperature=0.0)):
        config = DecodeConfig.of(max_new_tokens=N, **changes)
        with pytest.raises(DsparkError, match="sampled at temperature 1, top-p 1, not") as err:
            simulate_grid(sampled.replicates(rec)[0], [config])
        assert "\n" not in str(err.value)


def tempered(m: np.ndarray, temperature: float, top_p: float = 1.0) -> np.ndarray:
    """The rows of `m` as the verifier sees them (decoding/sampling.distribution): m^(1/T)
    renormalised, then the smallest set of likeliest tokens whose mass reaches top-p, renormalised."""
    m = m ** (1 / temperature)
    m = m / m.sum(axis=1, keepdims=True)
    order = np.argsort(-m, axis=1)
    ranked = np.take_along_axis(m, order, axis=1)
    before = ranked.cumsum(axis=1) - ranked
    # A mass before some token equal to top-p (0.6 + 0.3 against 0.9) is a tie that float32 and
    # float64 break differently: the models would keep a token the truth drops. Refused.
    assert top_p == 1.0 or np.abs(before - top_p).min() > 1e-3, f"top-p {top_p} ties a row's nucleus edge"
    kept = np.zeros_like(m)
    np.put_along_axis(kept, order, np.where(before < top_p, ranked, 0.0), axis=1)
    return kept / kept.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("temperature, top_p", [(0.3, 1.0), (0.5, 0.88)])
def test_below_temperature_1_the_decoder_and_replay_on_real_models_meet_the_exact_expectations(temperature, top_p):
    """The Markov pair as two real Llamas (tiny.markov_llama): our decoder, and replay of a record
    that replay/sampled.py makes from their forwards (p and q at the temperature and top-p, the
    residual's draws, the draft's rollouts), against the exact sums of the tempered matrices.
    Issue 55 asked whether replay reads low below T = 1; this holds each side to the truth
    alone, with no real run's noise between them (600 decodes and paths: 4 standard errors;
    benchmarks/checks/sampled_tiny.py --exact runs every temperature with more)."""
    from types import SimpleNamespace

    import tiny

    from dspark_bench.decoding.speculative import speculative_decode

    models = SimpleNamespace(target=tiny.markov_llama(P), draft=tiny.markov_llama(Q), eos_ids=frozenset())
    policy = dict(threshold=0.8, gamma_max=G, min_draft_len=0)
    truth = Exact(tempered(P, temperature, top_p), tempered(Q, temperature, top_p))(policy)
    config = DecodeConfig.of(max_new_tokens=N, temperature=temperature, top_p=top_p, **policy)
    real = np.mean([[len(rounds), sum(r.drafted for r in rounds), sum(r.accepted for r in rounds)]
                    for rounds in (speculative_decode(models.target, models.draft, [0], config.replace(seed=10_000 + s))
                                   .rounds for s in range(600))], axis=0)
    rec = sampled_recording.record_sampled(models, [[0]], config, G, paths=600, eos_ids=frozenset())
    replayed = per_sequence(rec, policy, temperature, top_p)
    assert np.allclose(real, truth, rtol=0.045), (real, truth)
    assert np.allclose(replayed, truth, rtol=0.045), (replayed, truth)
    # The truth moves with the temperature: at T = 1 the same policy's expectations differ.
    assert not np.allclose(Exact(P, Q)(policy), truth, rtol=0.03)


# --- on real models: the tiny pair ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(saved_pair):
    from dspark_bench.harness.models import load_pair

    return load_pair(*saved_pair, device="cpu")


def test_at_temperature_zero_a_sampled_record_replays_as_the_greedy_one(tiny):
    from dspark_bench.config import expand
    from dspark_bench.measure.recording import record

    ids = [[5, 17, 42, 9], [3, 8]]
    greedy = record(tiny, ids, 16, 4, eos_ids=frozenset())
    config = DecodeConfig.of(max_new_tokens=16)
    made = sampled_recording.record_sampled(tiny, ids, config, 4, paths=1, eos_ids=frozenset())
    (replicate,) = sampled.replicates(made)
    configs = expand({"threshold": [0.1, 0.3, 0.6], "gamma_max": [1, 2, 4], "min_draft_len": [0, 1]}, config)
    columns = ["rounds", "drafted_total", "accepted_total", "full_blocks", "draft_forwards"]
    draws = replicate.info["sampling"]["draws"]
    assert (simulate_grid(replicate, configs)[columns].to_numpy() == draws * simulate_grid(greedy, configs)[columns]
            .to_numpy()).all()


def test_every_stream_a_sampled_record_draws_from_is_its_own(tiny, monkeypatch):
    """Each path is sampled from its seed and its rollouts from a stream of their own: every
    generator a record seeds starts a different stream (compared by its first draws, since a CPU
    generator reads only a seed's low 32 bits: distinct seeds need not be distinct streams)."""
    import torch

    seeds, Generator = [], torch.Generator

    class Recording(Generator):
        def manual_seed(self, seed):
            seeds.append(seed)
            return super().manual_seed(seed)

    monkeypatch.setattr(torch, "Generator", Recording)
    config = DecodeConfig.of(max_new_tokens=6, temperature=1.0)
    sampled_recording.record_sampled(tiny, [[5, 17, 42], [3, 8]], config, 2, paths=3, eos_ids=frozenset())
    assert len(seeds) == 2 * 2 * 3  # a path's own and its rollouts', for 3 paths of 2 prompts
    starts = {tuple(torch.rand(8, generator=Generator().manual_seed(seed)).tolist()) for seed in seeds}
    assert len(starts) == len(seeds), sorted(seeds)


def test_a_paths_rejected_token_is_independent_of_its_own_token():
    """Given a rejection, the rejected token is norm(max(q - p, 0)) whatever the path's token is
    (the argument's step 3). The Markov Llamas from the token 1, where both p and the residual
    have more than one token: over 1,500 paths the first position's rejected token and path
    token pass a chi-square test of independence, and the rejected token's law is the residual's.
    Drawn from the path's own stream (the same exponentials), they fail both at p < 1e-10."""
    from types import SimpleNamespace

    import tiny
    from scipy.stats import chi2_contingency, chisquare

    models = SimpleNamespace(target=tiny.markov_llama(P), draft=tiny.markov_llama(Q), eos_ids=frozenset())
    config = DecodeConfig.of(max_new_tokens=2, temperature=1.0, seed=11)
    rec = sampled_recording.record_sampled(models, [[1]], config, 1, paths=1500, eos_ids=frozenset())
    token, rejected = rec.paths[:, 0], rec.rollout[:, 0, 0]
    table = np.array([[np.sum((token == y) & (rejected == r)) for r in range(3)] for y in range(3)])
    assert chi2_contingency(table[:, table.sum(axis=0) > 0]).pvalue > 1e-3, table
    law = residual(Q[1], P[1])  # norm(max(q - p, 0)) after the token 1: [0.8, 0.2, 0]
    assert (rejected != 2).all() and chisquare(np.bincount(rejected, minlength=3)[:2], law[:2] * 1500).pvalue > 1e-3


def round_counts(rounds, gamma: int) -> np.ndarray:
    """How many rounds drafted d and accepted a tokens, [d, a] flattened."""
    counts = np.zeros((gamma + 1, gamma + 1))
    for r in rounds:
        counts[r.drafted, r.accepted] += 1
    return counts.ravel()


def test_replayed_rounds_are_distributed_as_our_decoders_sampled_rounds(tiny):
    """The engine at T = 1 with top-p 0.9 over 120 seeds against replay of 120 sampled paths:
    the joint law of (drafted, accepted) per round, by a chi-square test of homogeneity."""
    from scipy.stats import chi2_contingency

    from dspark_bench.decoding.speculative import speculative_decode
    from dspark_bench.replay.simulate import simulate

    ids, runs, gamma = [7, 21, 33, 2], 120, 4
    config = DecodeConfig.of(max_new_tokens=16, temperature=1.0, top_p=0.9, threshold=0.3, gamma_max=gamma)
    real = [r for seed in range(runs) for r in
            speculative_decode(tiny.target, tiny.draft, ids, config.replace(seed=1000 + seed)).rounds]
    rec = sampled_recording.record_sampled(tiny, [ids], config, gamma, paths=runs, eos_ids=frozenset())

    def pvalue(rec) -> float:
        replayed = [r for rep in sampled.replicates(rec) for prompt in simulate(rep, config) for r in prompt]
        table = np.stack([round_counts(real, gamma), round_counts(replayed, gamma)])
        return chi2_contingency(table[:, table.sum(axis=0) > 0]).pvalue

    assert pvalue(rec) > 1e-3
    # Acceptance read the wrong way round, min(1, p/q): the same test tells it apart.
    swapped = sampled.SampledRecord(rec.paths, rec.lengths, rec.q_token, rec.p_token, rec.rollout, rec.confidences,
                                    rec.eos_ids, rec.info)
    assert pvalue(swapped) < 1e-6


def test_expectations_pool_totals_and_times_over_replicates():
    """Rates of the summed totals, speedups of the summed times (plain time over predicted time),
    and a t interval over the replicates around the pooled value."""
    import pandas as pd

    from dspark_bench.metrics import rates

    def table(rounds, drafted, accepted, tokens, time, plain_step=1.0):  # as simulate_grid's rows are
        out = pd.DataFrame({"config_id": [0], "rounds": [rounds], "drafted_total": [drafted],
                            "accepted_total": [accepted], "emitted_total": [tokens], "full_blocks": [0],
                            "draft_forwards": [drafted], "new_tokens": [tokens], "predicted_time": [time],
                            "predicted_speedup": [tokens * plain_step / time]})
        return out.assign(**rates(out))

    pooled = sampled.expected([table(10, 20, 10, 20, 10.0), table(10, 40, 30, 40, 40.0), table(5, 10, 5, 10, 4.0)])
    row = pooled.iloc[0]
    assert row["acceptance_rate"] == pytest.approx(45 / 70) and row["tokens_per_round"] == pytest.approx(70 / 25)
    assert row["predicted_speedup"] == pytest.approx(70 / 54) and row["replicates"] == 3
    assert row["tokens_per_round_low"] < row["tokens_per_round"] < row["tokens_per_round_high"]


def test_a_sampled_record_saves_loads_and_refuses_a_corrupt_file(records, tmp_path):
    rec = markov_record(50, 3)
    rec.save(tmp_path / "rec")
    again = sampled.load(tmp_path / "rec")
    assert isinstance(again, sampled.SampledRecord) and again.info["sampling"] == rec.info["sampling"]
    assert (again.paths == rec.paths).all() and (again.accept == rec.accept).all()
    assert (again.confidences["top1"] == rec.confidences["top1"]).all()
    (tmp_path / "rec" / "record.npz").write_bytes(b"not a record")
    with pytest.raises(DsparkError, match="is unreadable") as err:
        sampled.load(tmp_path / "rec")
    assert "\n" not in str(err.value)


def test_a_replicate_reads_the_path_while_the_coins_accept_then_the_rollout_after_the_rejection():
    """One row by hand (N = 5, G = 3, a path of 4 tokens): the coins reject at position 2 only,
    and position 4 is past the end. A round from j reads the path to the rejection at j + M_j,
    then that position's rollout (its step 0: the rejected token); accepted to the end, nothing."""
    path = np.array([[10, 11, 12, 13, -1]])
    rollout = 100 + np.arange(15).reshape(1, 5, 3)  # rollout[m, s] = 100 + 3m + s
    top1 = np.arange(15, dtype=np.float32).reshape(1, 5, 3) / 100
    info = {"max_new_tokens": 5, "gamma_record": 3, "prompt_tokens": [1], "sampling": {"paths": 1, "draws": 1}}
    rec = sampled.SampledRecord(path, np.array([4]), np.full((1, 5), 0.5), np.full((1, 5), 0.25), rollout,
                                {"top1": top1}, (), info)
    u = np.array([[0.1, 0.2, 0.9, 0.3, 0.0]])  # a_m = 0.5: rejected where u_m >= 0.5
    rejected = sampled.rejected_positions(u, rec.accept, rec.lengths)
    assert rejected.tolist() == [[False, False, True, False, True]]
    assert sampled.next_rejection(rejected).tolist() == [[2, 2, 2, 4, 4]]  # j + M_j
    replicate = sampled.on_coins(rec, np.array([0]), u)
    assert replicate.matches.tolist() == [[2, 1, 0, 1, 0]]
    assert replicate.rollout[0].tolist() == [[10, 11, 106],  # y_0, y_1, then the rejected token at 2
                                             [11, 106, 107],  # y_1, then position 2's rollout
                                             [106, 107, 108],  # rejected at once
                                             [13, -1, -1],  # accepted to the end: no rollout read
                                             [-1, -1, -1]]
    # On the path, a step's confidence is the draft's first step at that position; after, the rollout's.
    assert np.allclose(replicate.confidences["top1"][0, 0], [0.00, 0.03, 0.06])
    assert np.allclose(replicate.confidences["top1"][0, 1], [0.03, 0.06, 0.07])


def test_a_sampled_replays_interval_is_the_projects_one_t_quantile():
    """expected()'s 95 % half-width over n replicates is paired.t_quantile(n - 1) standard errors,
    past the table's 30 degrees of freedom too (not the normal's 1.96)."""
    import pandas as pd

    from dspark_bench.metrics import rates
    from dspark_bench.paired import t_quantile

    def table(speedup: float) -> pd.DataFrame:  # as simulate_grid's rows are
        out = pd.DataFrame({"config_id": [0], "rounds": [5], "drafted_total": [10], "accepted_total": [5],
                            "emitted_total": [10], "full_blocks": [0], "draft_forwards": [10], "new_tokens": [10],
                            "predicted_time": [10 / speedup], "predicted_speedup": [speedup]})
        return out.assign(**rates(out))

    rng = np.random.default_rng(0)
    for n in (3, 40):
        speedups = rng.uniform(1.0, 2.0, n)
        row = sampled.expected([table(s) for s in speedups]).iloc[0]
        half = t_quantile(n - 1) * speedups.std(ddof=1) / np.sqrt(n)
        assert row["predicted_speedup_high"] - row["predicted_speedup"] == pytest.approx(half, rel=1e-12)


def test_load_reads_either_kind_and_refuses_a_folder_without_both_files(tmp_path):
    from dspark_bench.decoding.confidence import METRICS
    from dspark_bench.replay.record import Record

    replicate = sampled.replicates(markov_record(8, 2))[0]
    greedy = Record(replicate.continuation, replicate.lengths, replicate.rollout,
                    {m: replicate.confidences["top1"] for m in METRICS}, (), replicate.info)
    greedy.save(tmp_path / "greedy")
    again = sampled.load(tmp_path / "greedy")
    assert type(again) is Record and (again.rollout == greedy.rollout).all() and again.matches is None
    markov_record(8, 2).save(tmp_path / "sampled")
    (tmp_path / "sampled" / "record.json").unlink()
    with pytest.raises(DsparkError, match="holds no replay record") as err:
        sampled.load(tmp_path / "sampled")
    assert "\n" not in str(err.value)


def test_a_record_along_our_decoders_output_reads_the_p_q_and_confidences_its_verifier_read(tiny, monkeypatch):
    """The record's one full forward against the decoder's cached passes (issue 64, part 3): along
    the decoder's own sampled output (which a record may be made along: it has the target's law,
    benchmarks/checks/sampled_lean.py), p and q of every token the verifier judged on the path and
    the confidence the rule read there are the record's, to float32's rounding."""
    import torch

    from dspark_bench.decoding import speculative
    from dspark_bench.decoding.sampling import distribution

    seen, verify = [], speculative.verify

    def watched(logits, block, config, generator):
        accepted, token = verify(logits, block, config, generator)
        seen.append((distribution(logits, config), block.probs, block.tokens.tolist(), int(accepted)))
        return accepted, token

    monkeypatch.setattr(speculative, "verify", watched)
    ids, config = [7, 21, 33, 2], DecodeConfig.of(max_new_tokens=24, temperature=0.8, top_p=0.9, threshold=0.3,
                                                   gamma_max=4, seed=5)
    result = speculative.speculative_decode(tiny.target, tiny.draft, ids, config)
    part = sampled_recording.record_along(tiny, ids, result.tokens, config, 4, 5, seed=1)
    start, judged = 0, 0
    for (p_rows, q_rows, tokens, accepted), rnd in zip(seen, result.rounds):
        for i in range(min(accepted + 1, len(tokens))):  # rows whose context is the path: up to the first rejection
            y = result.tokens[start + i]
            assert float(p_rows[i, y]) == pytest.approx(part.p_token[start + i], rel=1e-4, abs=1e-7)
            assert float(q_rows[i, y]) == pytest.approx(part.q_token[start + i], rel=1e-4, abs=1e-7)
            assert rnd.confidences[i] == pytest.approx(float(part.scores["top1"][start + i, 0]), abs=1e-5)
            judged += 1
        start += rnd.emitted
    assert judged >= 20 and start == len(result.tokens)
    assert torch.equal(torch.tensor(part.path), torch.tensor(result.tokens))
