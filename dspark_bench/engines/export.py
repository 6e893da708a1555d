"""Export a run's tuned policy into a serving engine's own vocabulary and file shape.

Engines mean different things by the same knobs (decoding/rules.py) and most cannot express a
confidence threshold at all:

| engine    | what it can express                                            | file                            |
|-----------|----------------------------------------------------------------|---------------------------------|
| hf        | top-1 threshold, HF's rule (failing token kept), no minimum    | the assistant's generation config|
| llamacpp  | top-1 threshold, llama.cpp's rule (--spec-draft-n-min discards)| llama-server flags              |
| vllm      | a fixed draft length (per batch size where the run has several)| speculative_config JSON         |
| sglang    | a fixed draft length                                           | a --config YAML (dashed names)  |
| trtllm    | a fixed draft length, with a {batch size: length} schedule     | LLM-API YAML (upper-bound keys) |

Each file is written for a named engine version (versions.py; files.py writes them).

Where the engine cannot express the tuned policy, the export takes the nearest policy it can:
the best of every policy the engine expresses, replayed on the run's own record with its own
cost model (or surface, per batch size). Both predicted speedups are reported side by side:
what deploying on that engine costs. No engine keys its policy by depth: a depth policy's is its
busiest depth bucket's policy where the engine runs that (`stand_in`), else as above.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dspark_bench import schedules
from dspark_bench.config import DecodeConfig, expand, from_dict
from dspark_bench.decoding.rules import bucket_policies, expressible
from dspark_bench.depth import DEPTH_LABELS
from dspark_bench.engines.files import FILES, NOTES, llamacpp_flags, parse, render  # noqa: F401 (the API)
from dspark_bench.engines.run_policies import RunPolicies, policy_of, run_policies, with_controller  # noqa: F401
from dspark_bench.engines.versions import EngineVersion, lacks, version_for
from dspark_bench.errors import DsparkError
from dspark_bench.harness.gguf import converted
from dspark_bench.replay import cost_file
from dspark_bench.replay.batched import predict_batched
from dspark_bench.replay.cost import CostModel, CostSurface
from dspark_bench.replay.simulate import simulate_grid, simulate_priced
from dspark_bench.results import read_json, write_text

FORMATS = ("hf", "vllm", "sglang", "trtllm", "llamacpp")
THRESHOLDS = tuple(round(t, 2) for t in np.arange(0.0, 1.0, 0.05))  # the nearest-policy search's grid


def candidates(fmt: str, base: DecodeConfig, gammas: list[int]) -> list[DecodeConfig]:
    """Every policy the engine expresses, over the grid the nearest-policy search replays."""
    plain = {"batch_quorum": 0.0, "goodput_model": ""}  # what no engine expresses
    fixed = expand({"gamma_max": gammas},
                   base.replace(schedule=schedules.BASELINE, min_draft_len=0, semantics="dspark", **plain))
    if fmt in ("vllm", "sglang", "trtllm"):
        return fixed
    rule = base.replace(metric="top1", schedule=schedules.THRESHOLD, semantics="hf" if fmt == "hf" else "llamacpp",
                        **plain)
    space = {"threshold": THRESHOLDS, "gamma_max": gammas, "min_draft_len": (0,) if fmt == "hf" else (0, 1, 2)}
    return fixed + expand(space, rule, strict=False)  # min_draft_len <= gamma_max


# --- the run: its best policy per batch size, and what replays it --------------------------------


def replayed(run: RunPolicies, configs: list[DecodeConfig], prices: CostModel | None = None) -> np.ndarray:
    """Predicted speedups of `configs` on the run's record and cost model (at each one's B), or
    priced on `prices` (an engine's batch-1 costs)."""

    rec = run.rec
    configs = [c.replace(max_new_tokens=rec.max_new_tokens) for c in configs]
    if any(c.stopping.gamma_max > rec.gamma_record for c in configs):
        raise DsparkError(f"the run's record is {rec.gamma_record} tokens deep; it cannot replay a longer draft")
    walked = [schedules.of(c).by_depth for c in configs]
    if any(walked):  # a depth policy: walked alone (a grid walks one threshold per draft position), at batch size 1
        cost = prices or (CostSurface.from_dict({k: v for k, v in run.cost.items() if k != "kind"}).at(1)
                          if run.cost["kind"] == "cost_surface.json" else CostModel.from_dict(run.cost))
        rest = iter(replayed(run, [c for c, alone in zip(configs, walked) if not alone], prices) if not all(walked)
                    else ())
        return np.array([simulate_priced(rec, c, cost)[0]["predicted_speedup"].iloc[0] if alone else next(rest)
                         for c, alone in zip(configs, walked)])
    if prices is not None:
        return simulate_grid(rec, configs, prices)["predicted_speedup"].to_numpy()
    if run.cost["kind"] == "cost_surface.json":
        surface = CostSurface.from_dict({k: v for k, v in run.cost.items() if k != "kind"})
        return predict_batched(rec, configs, surface)["predicted_speedup"].to_numpy()
    cost = CostModel.from_dict(run.cost)
    return simulate_grid(rec, configs, cost)["predicted_speedup"].to_numpy()


@dataclass
class Choice:
    batch_size: int
    tuned: DecodeConfig
    tuned_speedup: float  # predicted by replay where the run has a record, else as the run measured
    exported: DecodeConfig
    exported_speedup: float | None
    reasons: list[str]  # why the tuned policy was not exported as it is
    prices: str = ""  # whose costs priced the predicted speedups ("" : as the run measured)
    plain: str = ""  # why plain decoding is written instead (no speculative policy is predicted to win)
    over_defaults: float | None = None  # predicted speedup over the engine's own default policy


# The engines' own default policy, where speculation is on but not tuned: llama.cpp b11434's
# common.h (common_params_speculative_draft: n_max 3, n_min 0, p_min 0), i.e. fixed γ = 3.
DEFAULTS_OF = {"llamacpp": DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=3, min_draft_len=0,
                                           semantics="llamacpp")}


def engine_prices(run: RunPolicies, fmt: str):
    """The measured costs of `fmt`'s engine for the run's models: those the sweep itself was
    priced with where they are that engine's (its prices.json: the same on any machine the folder
    is copied to), else where a run measured them here (`run --decoder llamacpp`, cached), else
    None: the run's own prices. (A cost_file.CostFile.)"""
    if fmt != "llamacpp" or run.record is None:
        return None
    own = run.folder / "prices.json"  # replay_sweep.PRICES_FILE
    prices = cost_file.load(own) if own.is_file() else None
    if prices is None or prices.measured_by.get("name") != fmt:
        prices = cost_file.cached(fmt, run.info.get("models", {}))
    return prices if prices is not None and len(prices.surface.at(1).t_verify) > run.depth else None


def break_even(cost: CostModel) -> tuple[float, int]:
    """The acceptance rate each drafted token would need for a fixed γ to match plain decoding
    under `cost` (tokens a round emits, (1 − α^(γ+1)) / (1 − α), over what it costs), at the γ
    that needs least; and that γ."""
    def speedup(alpha: float, gamma: int) -> float:
        tokens = sum(alpha ** i for i in range(gamma + 1))
        return tokens * cost.plain_step / (gamma * cost.t_draft + cost.round_costs()[gamma])

    best = (1.0, 1)
    for gamma in range(1, len(cost.t_verify)):
        low, high = 0.0, 1.0
        for _ in range(50):  # bisection: the speedup rises with alpha
            middle = (low + high) / 2
            low, high = (middle, high) if speedup(middle, gamma) < 1 else (low, middle)
        best = min(best, (high, gamma))
    return best


def plain_because(cost: CostModel, label: str, best: float, acceptance: float) -> str:
    """Why plain decoding is exported: the measured draft/verify costs and the break-even acceptance."""
    alpha, gamma = break_even(cost)
    return (f"no speculative policy is predicted to beat plain decoding on {label}'s prices (the best, "
            f"{best:.3f}×). A draft step costs {cost.t_draft / cost.plain_step:.2f}× a plain decoding step there "
            f"(t_draft {cost.t_draft * 1e3:.2f} ms, plain {cost.plain_step * 1e3:.2f} ms, verify(1) "
            f"{cost.t_verify[1] * 1e3:.2f} ms, a round of γ = {gamma} "
            f"{(cost.round_costs()[gamma] - cost.t_verify[gamma]) * 1e3:.2f} ms past its passes): a fixed γ = {gamma} "
            "breaks even "
            f"only where each drafted token is accepted with probability {alpha:.2f}; this pair's first drafted token "
            f"is accepted with {acceptance:.2f}")


def choose(run: RunPolicies, fmt: str, version: EngineVersion | None = None) -> list[Choice]:
    """Per batch size: the tuned policy and what `fmt` gets (itself, or the nearest expressible in
    `version`, by default the engine's current one)."""
    if fmt not in FORMATS:
        raise DsparkError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    version = version or version_for(fmt)
    # per-B tables: vLLM's and TensorRT-LLM's; SGLang's adaptive controller, a slot per batch size
    per_batch = fmt in ("vllm", "trtllm") or any(schedules.of(c).controlled for c, _, _ in run.best.values())
    sizes = sorted(run.best) if per_batch else sorted(run.best)[:1]
    engine = engine_prices(run, fmt)
    if engine is not None:
        return [as_measured(priced_choice(run, fmt, engine), run, fmt, engine)]
    out = []
    for batch_size in sizes:
        tuned, speedup, _ = run.best[batch_size]
        reasons = expressible(tuned, fmt) + lacks(version, tuned)
        replayable = run.record is not None and run.cost is not None and tuned.stopping.gamma_max <= run.depth
        if not reasons:
            tuned_speedup = replayed(run, [tuned])[0] if replayable else speedup
            out.append(Choice(batch_size, tuned, float(tuned_speedup), tuned, float(tuned_speedup), [],
                              run.prices if replayable else ""))
            continue
        if not replayable:
            raise DsparkError(f"{fmt} cannot run the best policy ({tuned.label()}): it needs "
                              f"{'; '.join(reasons)}, and {run.folder.name} has no replay record to find the nearest "
                              "policy it can run; export a replay sweep's folder")
        pool, reasons = nearest_pool(run, fmt, tuned, reasons)
        speedups = replayed(run, [tuned] + pool)
        best = int(np.argmax(speedups[1:]))
        out.append(Choice(batch_size, tuned, float(speedups[0]), pool[best], float(speedups[1 + best]), reasons,
                          run.prices))
    return cap_schedule(run, fmt, out)


def nearest_pool(run: RunPolicies, fmt: str, tuned: DecodeConfig, reasons: list[str]):
    """What the nearest expressible policy is the best of by replay, and why `fmt` cannot run `tuned`:
    every policy the engine expresses; for a depth policy, its busiest bucket's (`stand_in`) alone
    where the engine runs that, named."""
    pool = candidates(fmt, tuned, list(range(1, run.depth + 1)))
    if not schedules.of(tuned).by_depth:
        return pool, reasons
    near, bucket, share = stand_in(run, tuned)
    busiest = f"its {bucket} bucket's policy ({near.label()}), where {share:.0%} of its rounds on the record run"
    lacks = expressible(near, fmt)
    if lacks:
        return pool, [*reasons, f"{busiest}, needs {'; '.join(lacks)} too: the best policy {fmt} runs is written"]
    return [near], [*reasons, f"{busiest}, is written (there one policy's choice weighs most)"]


def stand_in(run: RunPolicies, tuned: DecodeConfig) -> tuple[DecodeConfig, str, float]:
    """A depth policy's stand-in where one policy runs at every depth: the policy of the
    bucket holding most of its rounds on the record (where one policy's choice weighs most in the
    time; the deepest bucket's would serve only the few longest contexts), its name and that share."""
    buckets = simulate_priced(run.rec, tuned.replace(max_new_tokens=run.rec.max_new_tokens))[1]  # rounds per bucket
    busiest = buckets.loc[buckets["rounds"].idxmax()]
    near = bucket_policies(tuned)[DEPTH_LABELS.index(busiest["depth_bucket"])]
    return near, busiest["depth_bucket"], float(busiest["rounds"] / buckets["rounds"].sum())


def priced_choice(run: RunPolicies, fmt: str, engine) -> Choice:
    """Batch size 1 on the engine's own measured prices (cost_file.CostFile `engine`): the best of
    every policy the engine expresses, or plain decoding where none is predicted to beat it."""
    tuned, _, _ = run.best[min(run.best)]
    cost = engine.surface.at(1)
    pool, reasons = nearest_pool(run, fmt, tuned, expressible(tuned, fmt))
    speedups = replayed(run, [tuned] + pool + [DEFAULTS_OF[fmt]], cost)
    best = int(np.argmax(speedups[1:-1]))
    choice = Choice(1, tuned, float(speedups[0]), pool[best], float(speedups[1 + best]), reasons,
                    engine.label, over_defaults=float(speedups[1 + best] / speedups[-1]))
    if choice.exported_speedup <= 1.0:  # plain decoding: 1× by definition, and why
        rec = run.rec
        one = DecodeConfig.of(schedule=schedules.BASELINE, gamma_max=1, min_draft_len=0,
                              max_new_tokens=rec.max_new_tokens)
        acceptance = simulate_grid(rec, [one])["acceptance_rate"].iloc[0]  # of a first drafted token
        choice.plain = plain_because(cost, engine.label, choice.exported_speedup, float(acceptance))
        choice.exported_speedup, choice.over_defaults = 1.0, float(1.0 / speedups[-1])
    return choice


def measured_verdict(folder: Path, fmt: str) -> dict | None:
    """The sweep's verdict from running its best policies in this engine (summary.json's
    engine_verdict, `sweep --prices llamacpp` confirmed in llama-server), if it has one for `fmt`."""
    path = Path(folder) / "summary.json"
    if fmt != "llamacpp" or not path.is_file():
        return None
    return read_json(path, "summary file").get("engine_verdict") or None


def as_measured(choice: Choice, run: RunPolicies, fmt: str, engine) -> Choice:
    """Where the sweep measured its picks in this engine, export what it measured, not replay's
    pick: the policy that was faster than plain decoding beyond noise, else plain decoding."""
    verdict = measured_verdict(run.folder, fmt)
    if verdict is None:
        return choice
    best = verdict["best"]
    if verdict["wins"] != "speculative":  # with replay's why, where replay says so too
        measured = f"the sweep measured it in {verdict['engine']}: {verdict['sentence']}"
        choice.plain = f"{measured}. Replayed: {choice.plain}" if choice.plain else measured
        choice.exported_speedup = 1.0
        return choice
    measured = from_dict(best["config"]) if "config" in best else next(  # a sweep from before rows kept configs
        (c for c in [*candidates(fmt, choice.tuned, list(range(1, run.depth + 1))), DEFAULTS_OF[fmt]]
         if c.label() == best["policy"]), None)
    if measured is None:
        return choice
    choice.exported, choice.plain, choice.over_defaults = measured, "", None  # measured: the verdict says it
    # Replayed on the engine's prices, as every speedup of the table is; not where it drafts deeper
    # than the record (llama.cpp's defaults are measured whatever the sweep's depth).
    deep_enough = measured.stopping.gamma_max <= run.depth
    choice.exported_speedup = float(replayed(run, [measured], engine.surface.at(1))[0]) if deep_enough else None
    return choice


def cap_schedule(run: RunPolicies, fmt: str, choices: list[Choice]) -> list[Choice]:
    """TensorRT-LLM's draft_len_schedule gives its smallest key max_draft_len and no key more
    (validate_draft_len_schedule_and_sort): a longer draft at a larger batch size is capped at batch
    size 1's (and replayed as capped)."""
    if fmt != "trtllm" or len(choices) < 2:
        return choices
    ceiling = choices[0].exported.stopping.gamma_max
    for c in choices[1:]:
        if c.exported.stopping.gamma_max > ceiling:
            c.exported = c.exported.replace(gamma_max=ceiling)
            c.exported_speedup = float(replayed(run, [c.exported])[0]) if run.record and run.cost else None
            c.reasons = c.reasons + [f"a draft longer than at the smallest batch size (capped at {ceiling})"]
    return choices


# --- writing the files ------------------------------------------------------------------------------


def model_paths(fmt: str, models: dict) -> tuple[str, dict]:
    """The draft's path as `fmt` loads it, and the run's models with llama.cpp's GGUF files where
    they were converted (by `run --decoder llamacpp`; else placeholders the .md file explains)."""
    if fmt != "llamacpp":
        return str(models.get("draft", "DRAFT_MODEL")), models
    files = {role: converted(models.get(f"{role}_fingerprint", "")) for role in ("target", "draft")}
    models = {**models, "target_gguf": str(files["target"] or "TARGET.gguf")}
    return str(files["draft"] or "DRAFT.gguf"), models


def export(folder: Path, fmt: str, out: Path | None = None, engine_version: str | None = None,
           controller: bool = False):
    """Write the run's best policy for `fmt` into `out` (default RUN/export/): (files written,
    choices, the engine's file text, the version written for). `controller`: the engine's own
    draft-length controller as the run tuned it, in place of the best policy (run_policies.with_controller)."""

    if fmt not in FORMATS:
        raise DsparkError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    version = version_for(fmt, engine_version)  # before anything is read: a bad version is one line
    run = run_policies(folder)
    choices = choose(with_controller(run, fmt) if controller else run, fmt, version)
    draft, models = model_paths(fmt, run.info.get("models", {}))
    files = render(fmt, choices, models, version, draft)
    where = Path(out) if out is not None else run.folder / "export"
    if where.is_file():
        raise DsparkError(f"--out {str(where)!r} is a file; give a folder (each format writes its own files there)")
    where.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        write_text(where / name, text)
        written.append(where / name)
    return written, choices, files[FILES[fmt]], version
