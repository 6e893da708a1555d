"""The workload: what is decoded and how it is timed, shared by a run and a sweep.

A run (`harness.run.RunConfig`) and a sweep spec (`tuning.spec.SweepSpec`) both extend this one
frozen dataclass, so a field (and the flag or spec key that sets it) means the same thing in
both: the models, the prompts, how tokens are verified, how long each sequence is, and how the
runner times them. What a run or a sweep adds on top is the policies (a grid, or a search space).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dspark_bench import schedules
from dspark_bench.config import BATCHED, DEFAULT_MAX_NEW_TOKENS, KNOBS, same_as
from dspark_bench.errors import DsparkError
from dspark_bench.harness.allocator import keep_freed_memory
from dspark_bench.knobs import Needs, check_declared, check_needs, knob
from dspark_bench.replay.arrivals import poisson, read_trace

MODELS, PROMPTS, TIMING = "Models", "Prompts", "Timing"  # the --help groups of a workload's options
DATASET = Needs("--dataset (a task's prompts come as its file says)", lambda w, c: w.dataset is not None)


@dataclass(frozen=True)
class Workload:
    # --- models
    target: str | None = knob(None, "Target model: Hugging Face name, local folder or GGUF file (default: the "
                              "shipped reference pair).", panel=MODELS)
    draft: str | None = knob(None, "Draft model sharing the target's vocabulary (default: the reference pair's).",
                             panel=MODELS)
    heads: str | None = knob(None, "Heads drafter: a folder from `dspark-bench models build --heads` (default: the "
                             "shipped target's heads).", panel=MODELS)
    device: str = knob("auto", "Where the models run.", choices=("auto", "cpu", "cuda", "mps"), panel=MODELS)
    dtype: str = knob("auto", "auto: fp32 on CPU, bf16 on CUDA.", choices=("auto", "float32", "bfloat16", "float16"),
                      panel=MODELS)
    # On CUDA a policy's passes run from captured CUDA graphs unless told not to (decoding/capture.py).
    eager: bool = knob(False, "On CUDA, run every pass eagerly instead of from captured CUDA graphs (the default "
                       "there: static KV cache, one graph per pass length and batch size; "
                       "docs/gpu.md). No effect on a CPU; "
                       "refused with --compile.", panel=MODELS)
    # --- prompts: exactly one of task and dataset
    task: str | None = knob(None, "Built-in task (see `dspark-bench tasks ls`); several comma-separated "
                            "(code,humaneval) run side by side, each its own category.", panel=PROMPTS)
    dataset: str | None = knob(None, "Your prompts: JSONL/JSON/CSV/Parquet/text file, or a hub id.", panel=PROMPTS)
    split: str = knob("train", "Dataset split (hub datasets).", panel=PROMPTS, needs=DATASET)
    prompt_field: str | None = knob(None, "Column holding the prompt (default: guessed).", panel=PROMPTS,
                                    needs=DATASET)
    category_field: str | None = knob(None, "Column holding the category (default: guessed).", panel=PROMPTS,
                                      needs=DATASET)
    limit: int | None = knob(None, "Use only the first N prompts.", at_least=1, panel=PROMPTS)
    turns: str = knob("first", "Multi-turn prompts: the first turn, or all (each turn on the model's own answer).",
                      choices=("first", "all"), noun="--turns", panel=PROMPTS)
    chat_template: str = knob("auto", "auto: the tokenizer's chat template where it has one.", choices=("auto", "none"),
                              noun="--chat-template", panel=PROMPTS)
    # --- verification and lengths: the decoder's own knobs (config.py), a workload's for every policy
    temperature: float = same_as("temperature")
    top_p: float = same_as("top_p")
    topk: int = same_as("topk")
    max_new_tokens: int | None = same_as("max_new_tokens", default=None)  # None: the task's own, else the default
    seed: int = same_as("seed")
    ignore_eos: bool = knob(False, "Timing only: both sides generate exactly max_new_tokens (EOS does not end a "
                            "sequence).", panel=TIMING)
    # --- timing
    repeats: int = knob(1, "Timed baseline/speculative pairs per prompt (medians kept); the side that runs first "
                        "alternates.", at_least=1, panel=TIMING)
    warmup: int = knob(1, "Untimed decodes of each kind before timing starts.", at_least=0, panel=TIMING)
    trace: bool = knob(False, "Also write rounds.parquet, the per-round trace.", panel=TIMING)
    # B > 1: rows that finish are replaced from the waiting prompts ("refill", continuous
    # batching), or the batch empties before the next starts ("drain")
    batching: str = knob("refill", "B > 1: refill (a finished row's place goes to the next prompt, as continuous "
                         "batching does) | drain (each batch empties first).", choices=("refill", "drain"),
                         noun="--batching", panel=TIMING, needs=BATCHED)
    # The headline comparison (the best scheduled policy against the best fixed γ, paired on the
    # same prompts) timed again, pass after pass, until its 95 % interval is within ±precision
    # (0: one pass), or until precision_budget_s seconds of further passes are spent.
    precision: float = knob(0.0, "Repeat the headline comparison (best scheduled policy vs best fixed γ, paired on "
                            "the same prompts) until its 95 % interval is within ± this (e.g. 0.03), or "
                            "--precision-budget runs out (default: one pass).", at_least=0, below=1, panel=TIMING)
    # Above 0: a budget of nothing would let --precision run no pass and say it ran.
    precision_budget_s: float = knob(600.0, "Seconds of further passes --precision may spend.", above=0,
                                     flag="--precision-budget", panel=TIMING,
                                     needs=Needs("--precision", lambda w, c: w.precision > 0))
    # torch's CPU threads for the job (None: torch's own choice). On a machine another process keeps
    # busy, fewer threads than cores stop torch's threads fighting it (timing health says when).
    threads: int | None = knob(None, "torch's CPU threads (default: torch's own); on a busy machine, fewer than the "
                               "cores (e.g. 1) keep torch from fighting the other process.", at_least=1, panel=TIMING)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def tokens(self, task_tokens: int | None) -> int:
        """Tokens per prompt: the workload's own, else the task's, else the default."""
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return task_tokens or DEFAULT_MAX_NEW_TOKENS

    def check_workload(self) -> None:
        """Refuse settings no decode can run with (a run and a sweep alike), before anything loads:
        each field as declared (knobs.check_declared: its type, choices and bounds)."""
        check_declared(self)

    def check_needs(self, policies: list, grid: dict | None = None) -> None:
        """Refuse, before any work, a knob set where none of `policies` would read it
        (knobs.check_needs): a field of this workload away from its default, or a policy knob of
        the run's `grid` (knob -> values)."""
        declared = {f.name: f for f in dataclasses.fields(self)}
        changed = {name: [getattr(self, name)] for name, f in declared.items() if f.default is not dataclasses.MISSING}
        check_needs({**KNOBS, **declared}, {**changed, **(grid or {})}, self, policies)

    def prepare_host(self) -> None:
        """Before any model loads: keep what the process frees mapped (harness/allocator.py: a
        server's steady state, and neither side of a timed pair paying the other's growth), and set
        torch's CPU threads as the workload asks."""
        keep_freed_memory()
        if self.threads is None:
            return
        import torch  # only when a job starts: the CLI's options are made from this module, without torch

        torch.set_num_threads(self.threads)

    def runner_settings(self, decoder: str = "ours") -> RunnerSettings:
        """How every timed or recorded decode of this workload runs."""
        return RunnerSettings(repeats=self.repeats, warmup=self.warmup, trace=self.trace,
                              chat_template=self.chat_template, turns=self.turns, ignore_eos=self.ignore_eos,
                              batching=self.batching, eager=self.eager, decoder=decoder)


WORKLOAD_FIELDS = tuple(f.name for f in dataclasses.fields(Workload))


LOAD = "Under load"  # the --help group of a load's settings
LOADED = Needs("a load (--arrival-rate or --arrival-trace)", lambda w, c: served(w))
# Prices timed inside decodes are a replay's: a replay sweep's or calibration's (their `prices_replayed`
# says), a run's under load, where replay's prediction is set beside the measurement.
PRICED = Needs("replay's prices (a replay sweep, or a run under load)", lambda w, c: w.prices_replayed())


@dataclass(frozen=True)
class Served:
    """The load a server is given — requests arriving at each rate or by a trace, at most
    `max_batch` at once (docs/batch-sizes.md#under-load) — and which prices replay charges its
    steps: a sweep replays its policies under it, `run --arrival-rate` serves it for real beside
    replay's prediction. Both extend this dataclass, so each flag means one thing in both."""

    # Poisson arrivals, one load per rate (`--arrival-rate R`, repeatable), the prompts in turn.
    arrival_rates: tuple[float, ...] = ()
    arrival_trace: str | None = knob(None, "Under load: a trace of arrival times, seconds, one per line (as "
                                     "well as or instead of --arrival-rate).", path=True, panel=LOAD)
    requests: int = knob(200, "Under load: requests per arrival rate, the prompts in turn (a Poisson "
                         "process seeded by --seed).", at_least=1, panel=LOAD, needs=LOADED)
    max_batch: int | None = knob(None, "Under load: most requests decoded at once, at most the largest "
                                 "--batch-size (default: that).", at_least=1, panel=LOAD, needs=LOADED)
    # Replay prices every batch size and load from passes timed inside running decodes of the
    # prompts (harness/in_decode.py): isolated passes read a loaded server 19-33 % fast.
    isolated_prices: bool = knob(False, "Price replay on passes timed alone (the faster, optimistic prices) instead "
                                 "of inside running decodes of the prompts (docs/batch-sizes.md#in-decode-prices).",
                                 flag="--isolated-prices", panel=LOAD, needs=PRICED)

    def prices_replayed(self) -> bool:
        """Whether replay prices anything here: under a load (a sweep says more: tuning.spec)."""
        return served(self)

    def loads(self) -> list:
        """The loads served: a Poisson process per rate (seeded by --seed), then the trace (replay.arrivals)."""
        rates = [poisson(rate, self.requests, self.seed) for rate in self.arrival_rates]
        return rates + ([read_trace(self.arrival_trace)] if self.arrival_trace is not None else [])

    def check_load(self) -> None:
        """Each of the load's settings as declared (knobs.check_declared), before anything loads."""
        check_declared(self)


def served(workload) -> bool:
    """Whether a load is given (arrival rates or a trace)."""
    return bool(workload.arrival_rates) or workload.arrival_trace is not None


def check_served(config: Served, configs: list) -> None:  # config: a harness.run.RunConfig
    """Refuse, before any model loads, a run under load (`run --arrival-rate`: harness/served_run.py)
    the batched decoder cannot serve, or whose load is not one (harness.run.check calls it)."""
    for rate in config.arrival_rates:
        poisson(rate, 1)  # one line for a rate that is not a number above 0
    if len(set(config.arrival_rates)) != len(config.arrival_rates):
        raise DsparkError("--arrival-rate: give each rate once")
    if config.arrival_trace is not None:
        read_trace(config.arrival_trace)  # an unreadable trace is refused now, not after the models load
    refusals = [(config.decoder != "ours", "serves our batched decoder: drop --decoder"),
                (config.calibration is not None, "serves the policies given: drop --calibration"),
                (config.turns == "all", "serves each prompt's first turn: drop --turns all"),
                (not all(c.greedy for c in configs), "predicts greedy decoding (replay under load follows the "
                                                     "greedy record): use --temperature 0"),
                (any(c.drafting.drafter != "model" for c in configs), "drafts with the draft model (the batched "
                                                                      "decoder's drafter): drop --drafter"),
                (any(c.verification.compiled for c in configs), "runs its servers side by side on eager passes "
                                                                "(one static cache per model): drop --compile"),
                (any(schedules.any_family(c) for c in configs), "runs a depth policy of plain threshold/gamma_max "
                                                                "entries (one metric for a batch's rows)"),
                (config.repeats > 1 or config.precision > 0, "serves each load once: drop --repeats and "
                                                             "--precision")]
    for refused, why in refusals:
        if refused:
            raise DsparkError(f"a run under load (--arrival-rate, --arrival-trace) {why}")


@dataclass(frozen=True)
class RunnerSettings:
    """What harness.runner reads of a workload: how it times and feeds each decode, and which
    speculative decoder it times against the baseline. Declared here, beside the workload, so that
    each setting is the workload's own declaration (its default written once) and the runner,
    which imports this module, is imported by nothing here."""

    repeats: int = same_as("repeats", of=Workload)  # timed A/B pairs per (prompt, config); medians are kept
    warmup: int = same_as("warmup", of=Workload)  # untimed decodes of each kind before timing starts
    trace: bool = same_as("trace", of=Workload)  # keep per-round rows (rounds.parquet)
    chat_template: str = same_as("chat_template", of=Workload)
    turns: str = same_as("turns", of=Workload)  # "first" or "all" turns of multi-turn prompts
    # Timing-only runs: both sides generate exactly max_new_tokens, EOS not ending a sequence
    # (as benchmark suites' "ignore EOS" does), so sampled outputs have equal lengths.
    ignore_eos: bool = same_as("ignore_eos", of=Workload)
    batching: str = same_as("batching", of=Workload)  # B > 1: "refill" rows as they finish, or "drain"
    eager: bool = same_as("eager", of=Workload)  # CUDA: no captured passes (decoding/capture.py)
    decoder: str = "ours"  # the speculative side: our decoder, or "hf" assisted generation under HF's rule

    def eos_ids(self, pair) -> frozenset[int]:
        """The ids that end a sequence in this run (a harness.models.ModelPair's): none when EOS is ignored."""
        return frozenset() if self.ignore_eos else pair.eos_ids
