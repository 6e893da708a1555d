"""A sweep's preparation, shared by replay sweeps (replay_sweep.py) and real ones (sweep.py):
the prompts read, the space expanded once on the base policy, the models loaded, the prices
`--prices` names found (or measured by an engine the command line lends), and an engine's
continuations file checked, all before any folder or record is written; and what a finished
sweep of either kind hands back (SweepResult)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pandas as pd

from dspark_bench import schedules
from dspark_bench.config import LEARNED, DecodeConfig
from dspark_bench.engines.registry import EngineRegistry
from dspark_bench.errors import DsparkError
from dspark_bench.harness.models import context_warning, load_pair
from dspark_bench.replay import cost_file
from dspark_bench.replay.continuations import Continuations, check_files, open_for
from dspark_bench.sections import registry
from dspark_bench.sections.sampling import Sampling
from dspark_bench.tasks import load_prompts, pair_of
from dspark_bench.tasks.prompts import encode
from dspark_bench.tuning.spec import SweepSpec, base_config, evaluation_for, points

if TYPE_CHECKING:
    from dspark_bench.harness.runner import StageProgress


@dataclass
class LoadedSweep:
    """What a sweep works on: the models, the prompts, the policy its space starts from, where the
    prompts came from, and the target's continuations where an engine's file gives them."""

    pair: object
    prompts: list
    base: DecodeConfig
    source: dict
    continuations: Continuations | None = None  # the target's, from an engine's file (checked)
    points: list = field(default_factory=list)  # the spec's space expanded on `base`, once (spec.points)
    prices: object = None  # the engine's cost model --prices names (a cost_file.CostFile); None: ours, timed here


@dataclass
class SweepResult:
    """What a finished sweep hands back, for the CLI or a notebook to show without reading its
    folder again: the folder, its best policies (ranked), the summary it wrote (summary.json),
    what it searched, and the sections it found (sections/: depth, load, sampling, the engine's
    verdict, its analyses where it ran them), typed."""

    folder: Path
    table: pd.DataFrame
    summary: dict
    spec: SweepSpec
    sections: list = field(default_factory=list)

    def __post_init__(self):
        if not self.sections:  # a sweep read back (resumed): the sections its summary.json holds
            self.sections = registry.read(self.summary)

    def title(self) -> str:
        """What the sweep searched and how: the heading of its printed table."""
        eos = " · EOS ignored" if self.spec.ignore_eos else ""
        if self.spec.temperature > 0:
            eos += f" · sampled at temperature {self.spec.temperature:g}, top-p {self.spec.top_p:g}"
        sampling = registry.find(self.sections, Sampling)
        if sampling is not None:
            eos += f" ({sampling.per_prompt()})"
        if self.summary["evaluation"] == "replay":
            confirmed = len(self.summary["confirmed"])
            said = (f"the best {confirmed} confirmed by timed runs (the best fixed gamma among them)" if confirmed
                    else "replay's answer alone (--confirm-top 0: nothing timed)")
            return (f"{self.summary['policies_simulated']:,} policies searched by replay (simulated from one record, "
                    f"fixed gamma included); {said}{eos}")
        complete = self.summary.get("trial_states", {}).get("COMPLETE", 0)
        return f"{complete} policies searched by real timed runs ({self.summary['method']}){eos}"


def check_sampled_replay(spec: SweepSpec, configs: list[DecodeConfig]) -> None:
    """What replay at a temperature > 0 cannot do (replay/sampled.py), refused before models load."""
    if spec.temperature == 0 or evaluation_for(spec) != "replay":
        return
    if any(c.drafting.drafter == "heads" for c in configs):
        raise DsparkError("sampled replay records the draft model and the lookup drafter, not the heads: time the "
                          "heads at a temperature with --evaluation real")
    if any(c.stopping.metric == LEARNED for c in configs):
        raise DsparkError("the learned signal reads drafted tokens, which a sampled record does not hold: search it "
                          "greedy, or with --evaluation real")
    if spec.prices == "llamacpp":
        raise DsparkError("llama.cpp's prices are measured, and its policies confirmed, greedy: a sweep at a "
                          "temperature is priced on ours or on a cost-model file (drop --prices llamacpp)")


def prepare(spec: SweepSpec, say: Callable[[str], None] | None = None, engines: EngineRegistry | None = None,
            progress: StageProgress | None = None) -> LoadedSweep:
    spec.prepare_host()
    cost_file.check_choice(spec.prices)  # a bad --prices ends before anything loads
    if spec.continuations is not None:  # so does a missing or foreign continuations file
        if spec.temperature > 0:
            raise DsparkError("--continuations holds the target's greedy continuations: a sweep at a temperature "
                              "samples its own paths here (drop --continuations, or --temperature)")
        check_files(spec.continuations, spec.ignore_eos)
    prompts, source, task_tokens = load_prompts(spec.task, spec.dataset, spec.split, spec.prompt_field,
                                                spec.category_field, spec.limit)
    base = base_config(spec, task_tokens)
    configs = points(spec, base)  # expanded once; a threshold out of range fails here, before models load
    check_sampled_replay(spec, configs)
    priced = sorted({c.stopping.schedule for c in configs if schedules.of(c).priced and not c.stopping.goodput_model})
    if priced and evaluation_for(spec) != "replay":
        raise DsparkError(f"{priced[0]} budgets with the step costs a replay sweep measures: sweep it by replay")
    pair = load_pair(spec.target, spec.draft, spec.device, spec.dtype, spec.heads,
                     drafters={c.drafting.drafter for c in configs}, pair=pair_of(spec.task))
    prepared = LoadedSweep(pair, prompts, base, source, points=configs)
    warning = context_warning(pair, prompts, base.verification.max_new_tokens, spec.chat_template) if say else None
    if warning:
        say(warning)
    prepared.prices = engine_prices(spec, prepared, (engines or EngineRegistry()).measure, say, progress)
    if spec.continuations is not None:  # checked before any folder or record is written
        prepared.continuations = open_continuations(spec, pair, prompts, base, say)
    return prepared


def engine_prices(spec: SweepSpec, prepared: LoadedSweep, measurers: dict[str, Callable], say, progress):
    """The cost model --prices names, before any record: a file's or a cached one, checked against
    the pair; measured now where a measurer for that engine is given (it caches what it measures)."""
    if evaluation_for(spec) != "replay":
        return None  # a real sweep times every policy on our decoder: no prices rank it
    if spec.prices in measurers:
        gamma = max(c.stopping.gamma_max for c in prepared.points)  # the fixed γ replay adds are among these
        return measurers[spec.prices](spec, prepared.pair, prepared.prompts, gamma,
                                      prepared.base.verification.max_new_tokens, say, progress)
    return cost_file.resolve(spec.prices, prepared.pair.describe())


def open_continuations(spec: SweepSpec, pair, prompts: list, base: DecodeConfig, say=None) -> Continuations:
    """The spec's continuations files, checked against `prompts` as this pair encodes them
    (prepare checked what needs neither: the files' headers, greedy decoding)."""
    ids = [encode(pair.tokenizer, p.text, spec.chat_template) for p in prompts]
    vocab = pair.target.get_output_embeddings().weight.shape[0]
    return open_for(spec.continuations, prompts, ids, base.verification.max_new_tokens,
                    spec.runner_settings().eos_ids(pair), vocab, say, ignore_eos=spec.ignore_eos)
