"""The commands' own options, declared once each (knobs.knob), as the knobs and the workload's
settings are: --out means one thing with one flag whichever command takes it, and its help, default
and type are written here only.

A command takes the options it reads with `command_options("out", "spec", ...)`: each becomes the
command's own parameter of that name (cli/declared.py's `with_options(None, ...)`), in the place
its signature lists it, a path as a Path. Where one command needs its own wording or default of a
shared option (--out is a run folder's parent for `run`, the file it writes for `calibrate`), it
says so there (`helps=`, `defaults=`; REQUIRED: the option must be given). The values are checked
where they are used: by the library the command calls, as a caller of the library's would be.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from dspark_bench.cli.declared import REQUIRED, with_options
from dspark_bench.knobs import knob
from dspark_bench.reporting.regress import DEFAULT_SPEED_TOLERANCE, DEFAULT_TOLERANCE

__all__ = ["REQUIRED", "CommandOptions", "command_options"]


@dataclass(frozen=True)
class CommandOptions:
    """Every option a command reads that is neither a knob (config.py) nor a workload setting
    (harness/workload.py). Never built: its fields are the declarations."""

    # --- what a command writes, and how it prints
    out: Path | None = knob(Path("results"), "Folder that receives the run folder.", path=True)
    force: bool = knob(False, "Overwrite an existing calibration file and figure.")
    wide: bool = knob(False, "Print every column of the table, not the six that fit 100 columns.", flag="--wide")
    fmt: str = knob("png", "Figure format: png | svg.", flag="--format")
    # --- what a command reads besides its workload
    spec: Path | None = knob(None, "Sweep specification (YAML): the search space, objective and limits, e.g. "
                             "sweeps/code.yaml.", path=True)
    objective: str | None = knob(None, "What to maximise: speedup | tokens_per_round | ...; two, comma-separated, for "
                                 "a Pareto front.")
    continuations: Path | None = knob(None, "Replay: the target's greedy continuations from the engine that serves it "
                                      "(a continuations file: `dspark-bench continuations`), recorded from instead of "
                                      "decoding the target here.", path=True)
    calibration: Path | None = knob(None, "Per-domain policies from `calibrate`: each prompt gets its category's.",
                                    path=True)
    tasks: str | None = knob(None, "Built-in tasks, comma-separated: one domain each (e.g. code,prose,structured).")
    config: Path | None = knob(None, "Run what a run folder's run.json describes, again (other flags but --out are "
                               "refused).", path=True)
    # --- what a deployed engine counted (observe)
    window: float | None = knob(None, "observe, one metrics URL: seconds between its two scrapes (the window read; "
                                "default 60).")
    prices: Path | None = knob(None, "observe: a cost-model file (the engine's measured prices, or ours) that prices "
                               "each shorter draft length for the advice.", path=True)
    against: Path | None = knob(None, "observe: a replay sweep's folder; the window is held against replay's "
                                "prediction for the policy its export deploys (exit 0 as predicted, 1 drifted, 2 no "
                                "verdict).",
                                path=True)
    served_model: str | None = knob(None, "observe --against: the sweep's target as the engine names it (its "
                                    "/v1/models id or model_name label), where the engine calls it otherwise.")
    # --- who decodes: our decoder, HF's, or llama.cpp's server
    decoder: str = knob("ours", "The speculative side: ours | hf (HF assisted generation, HF's rule: --semantics hf, "
                        "top1, --min-draft-len 0) | llamacpp (llama-server with the flags export writes, one server "
                        "per policy, beside ours and replay priced on llama.cpp's measured costs and on ours; "
                        "llama.cpp's rule unless --semantics says otherwise; GGUF --target/--draft go to llama-server "
                        "as they are).")
    llama_server: Path | None = knob(None, "--decoder llamacpp: the llama-server binary (default: "
                                     "tools/build-llama-server.sh's build, then PATH).", path=True)
    port: int | None = knob(None, "--decoder llamacpp: the plain server's port on 127.0.0.1, the speculative one's "
                            "next (default: free ones).")
    # --- a sweep's study: where it is stored, who works on it, how it is cut up
    storage: str | None = knob(None, "Optuna storage URL (sqlite:///, postgresql://, journal:///path) (default: SQLite "
                               "in the run folder).")
    study: str | None = knob(None, "Study name, shared by workers on one storage.")
    workers: int = knob(1, "Local worker processes on the same study.")
    resume: Path | None = knob(None, "Continue this sweep's run folder where it stopped.", path=True)
    shard: str | None = knob(None, "With --continuations: record only shard I/N of the prompts (machine I of N) and "
                             "stop; the sweep without --shard assembles every shard's parts. 1/1: record every "
                             "prompt, and stop.")
    arrival_rate: float | None = knob(None, "Replay under load: requests arriving per second (a Poisson process); "
                                      "repeatable, one load each: the best policy per rate (docs/batch-sizes.md).",
                                      repeats=True, panel="Under load")  # tuning/spec.py's LOAD panel
    set_: str | None = knob(None, "Override any spec field: key=value (YAML value), e.g. space.threshold=[0.2,0.4].",
                            flag="--set", repeats=True)
    # --- regress: the baseline, what is compared with it, and how closely
    baseline: Path = knob(REQUIRED, "The baseline's summary.json (run.json and samples.parquet beside it).", path=True)
    current: Path | None = knob(None, "Compare this run folder instead of re-running the baseline's benchmark.",
                                path=True)
    tolerance: float = knob(DEFAULT_TOLERANCE, "Relative tolerance on the deterministic policy metrics.")
    speed_tolerance: float = knob(DEFAULT_SPEED_TOLERANCE, "Flag a speedup below (1 - this) × the baseline's.")
    strict_speed: bool = knob(False, "Fail, not just flag, a speedup outside --speed-tolerance.")
    report: Path | None = knob(None, "Write the Markdown table here (default: regress.md in the current run folder).",
                               path=True)
    update: bool = knob(False, "Rewrite the baseline from --current or a fresh re-run, on purpose.")
    # --- export, report, decode
    engine_version: str | None = knob(None, "The engine version to write for (default: its current release; "
                                      "llamacpp: a build such as b11434, or legacy).")
    controller: bool = knob(False, "Export the engine's own draft-length controller as the sweep tuned it (SGLang's "
                            "adaptive steps, TensorRT-LLM's schedule and gate), not the best policy.")
    by: str | None = knob(None, "Group the best-vs-classic bars by category | task | run (default: category).")
    domain: str | None = knob(None, "With --calibration: the prompt's domain (default: the global policy).")


DECLARED = {f.name: f for f in dataclasses.fields(CommandOptions)}


def command_options(*names: str, many=True, helps: dict | None = None, defaults: dict | None = None):
    """The decorated command's parameters `names`, each made the option declared above (a name
    not declared is an error). `many`, `helps`, `defaults`: as cli/declared.py's with_options."""
    return with_options(None, [DECLARED[name] for name in names], many=many, helps=helps, defaults=defaults)
