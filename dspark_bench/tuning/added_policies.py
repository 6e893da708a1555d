"""The policies every replay sweep adds to its space, and the fits they decide with: fixed gamma
joins in replay_sweep.replay_space; here the goodput and budget schedules (no threshold to
search: they join at every metric, gamma_max and batch size) on the record's acceptance fit, and
the learned signal, fitted on the record, in place of the first metric of every scheduled policy."""

from __future__ import annotations

from pathlib import Path

from dspark_bench import schedules
from dspark_bench.config import LAYOUTS, LEARNED, DecodeConfig, expand
from dspark_bench.decoding.goodput import GoodputModel
from dspark_bench.decoding.learned_signal import FILE as LEARNED_FILE
from dspark_bench.decoding.learned_signal import LearnedSignal
from dspark_bench.errors import DsparkError
from dspark_bench.replay import learned
from dspark_bench.replay.acceptance import load_or_fit
from dspark_bench.results import write_json


def goodput_points(configs: list[DecodeConfig], model_file: Path) -> list[DecodeConfig]:
    """The goodput schedule at every metric, gamma_max and batch size of the space: it has no
    threshold to search, so it joins every replay sweep, as fixed gamma does — for the draft
    model (its acceptance fit is the draft model's record's)."""
    configs = [c for c in configs if c.drafting.drafter == "model"]
    if not configs:
        return []
    base = configs[0].replace(schedule=schedules.GOODPUT, min_draft_len=0, semantics="dspark", batch_quorum=0.0,
                              goodput_model=str(Path(model_file).resolve()))
    return expand({"batch_size": sorted({c.batching.batch_size for c in configs}),
                   "metric": list(dict.fromkeys(c.stopping.metric for c in configs)),
                   "gamma_max": sorted({c.stopping.gamma_max for c in configs})}, base)


def budget_points(configs: list[DecodeConfig], model_file: Path) -> list[DecodeConfig]:
    """The budget schedule where goodput joins, in both layouts at B > 1 (padded: what our batched
    decoder runs; packed: what vLLM, SGLang and TensorRT-LLM run), and at B = 1 (goodput's rule on
    the cost table)."""
    return list(dict.fromkeys(c.replace(schedule=schedules.BUDGET, budget_layout=layout)
                              for c in goodput_points(configs, model_file) for layout in LAYOUTS
                              if c.batching.batch_size > 1 or layout == "padded"))


def priced_points(configs: list[DecodeConfig], model_file: Path) -> list[DecodeConfig]:
    """`configs`, a controller that budgets with step costs (vllm-adaptive) and was given none now
    given the sweep's goodput model's: what vLLM profiles at start-up, this pair measured here."""
    costs = str(Path(model_file).resolve())
    return list(dict.fromkeys(c.replace(goodput_model=costs) if schedules.of(c).priced and not c.stopping.goodput_model
                              else c for c in configs))


def added_count(configs: list[DecodeConfig]) -> int:
    """How many policies goodput_points, budget_points and learned_points add to `configs` (a
    replay space, fixed γ included), counted from the space's axes before the record and its fits
    exist: the plan says it. tests/test_sweep.py holds it equal to what joins."""
    model = [c for c in configs if c.drafting.drafter == "model"]
    if not model:
        return 0
    metrics = list(dict.fromkeys(c.stopping.metric for c in model))
    gammas = len({c.stopping.gamma_max for c in model})
    # Per metric: goodput once and budget once per layout it runs in, at each batch size.
    per_metric = gammas * sum(1 + (len(LAYOUTS) if b > 1 else 1) for b in {c.batching.batch_size for c in model})
    scheduled = [c for c in configs if not schedules.of(c).baseline and not schedules.of(c).controlled]
    first = scheduled[0].stopping.metric if scheduled else metrics[0]  # learned_points' first metric
    learned = sum(c.stopping.metric == first and c.drafting.drafter == "model" for c in scheduled)
    if not model[0].greedy:  # a sampled record teaches no learned signal (replay_sweep.join_fitted)
        return len(metrics) * per_metric
    return len(metrics) * per_metric + learned + (per_metric if first in metrics else 0)


def write_goodput_model(folder: Path, rec, record_dir: Path, surface) -> Path:
    """Fit acceptance on the record (kept beside it) and write the sweep's goodput model."""

    model = GoodputModel.build(load_or_fit(rec, record_dir), surface)
    write_json(folder / "goodput_model.json", model.to_dict())
    return folder / "goodput_model.json"


def write_learned_signal(folder: Path, rec, record_dir: Path):
    """Fit the learned signal on the record (kept beside it) and write it into the sweep folder:
    (its file, the record with the signal at every rollout step, as our decoder computes it), or None where the
    record cannot teach one (one prompt; every token accepted, or none)."""
    try:
        fitted = learned.load_or_evaluate(rec, record_dir)
    except DsparkError:
        return None
    write_json(folder / LEARNED_FILE, fitted)
    return folder / LEARNED_FILE, learned.with_learned(rec, LearnedSignal.from_dict(fitted))


def learned_points(configs: list[DecodeConfig], signal_file: Path) -> list[DecodeConfig]:
    """Every scheduled policy of the draft model on the space's first metric, with the learned
    signal in its place (the goodput ones included: it reads the signal as its own curve; not an
    engine's controller, which reads no metric of ours)."""
    first = next((c.stopping.metric for c in configs if not schedules.of(c).baseline
                  and not schedules.of(c).controlled), None)
    path = str(Path(signal_file).resolve())
    return [c.replace(metric=LEARNED, signal_model=path) for c in configs if c.stopping.metric == first
            and not schedules.of(c).baseline and not schedules.of(c).controlled and c.drafting.drafter == "model"]
