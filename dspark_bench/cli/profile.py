"""`dspark-bench profile`: a policy's acceptance profile, replayed on a sweep's record, for the engines' simulators."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_bench.cli.console import cli_errors, out_console
from dspark_bench.cli.declared import knob_fields, with_options
from dspark_bench.cli.options import command_options
from dspark_bench.config import POLICY_FIELDS

# A stopping policy's knobs, one request at a time on the sweep's own drafter (replay walks the
# record's draft model): each given replaces the best policy's.
KNOBS = tuple(name for name in POLICY_FIELDS if name not in ("drafter", "ngram_min", "ngram_max", "batch_quorum"))


@with_options("knobs", knob_fields(KNOBS), unset="the sweep's best policy's")
@command_options("out", defaults={"out": None}, helps={
    "out": "Folder to write into (default: FOLDER/profiles/, or FOLDER/profiles-<policy>/ for another policy)."})
def profile(
    folder: Annotated[Path, typer.Argument(help="A replay sweep's folder (its record replays the policy).")],
    *, out: Path | None, knobs: dict | None = None,
):
    """Write the acceptance profile of the sweep's best policy (or of the policy the knobs given make
    of it), replayed on its record, in the forms the engines' simulators read: ModelOpt's
    speculation_profile.json, vLLM's synthetic acceptance rates, SGLang's SGLANG_SIMULATE_ACC_LEN,
    Dynamo's --aic-nextn-accept-rates.

    Example: dspark-bench profile results/20250101-120000-sweep-abc123
    Example: dspark-bench profile results/20250101-120000-sweep-abc123 --schedule fixed --gamma-max 4
    """
    from dspark_bench.engines.profiles import write_profiles  # loaded when the command runs, not for --help

    say = lambda line: out_console.print(line, highlight=False, soft_wrap=True, markup=False)  # noqa: E731
    with cli_errors():
        written, whole, policy = write_profiles(folder, out, knobs)
    say(f"{policy.label()}: {whole.rounds:,} rounds replayed, mean acceptance length {whole.mean_accept_length:.3f}")
    say("marginal (P(L ≥ i+1)): " + ", ".join(f"{x:.3f}" for x in whole.marginal))
    say("conditional (P(L ≥ i+1 | L ≥ i)): " + ", ".join(f"{x:.3f}" for x in whole.conditional))
    for name in sorted(p.name for p in written.iterdir()):
        say(f"written: {written / name}")
