"""`dspark-bench profile`: a sweep's best policy's acceptance profile, for the engines' simulators."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_bench.cli.console import cli_errors, out_console
from dspark_bench.cli.options import command_options


@command_options("out", defaults={"out": None}, helps={"out": "Folder to write into (default: FOLDER/profiles/)."})
def profile(
    folder: Annotated[Path, typer.Argument(help="A replay sweep's folder (its record replays the policy).")],
    *, out: Path | None,
):
    """Write the acceptance profile of the sweep's best policy, replayed on its record, in the forms the
    engines' simulators read: ModelOpt's speculation_profile.json, vLLM's synthetic acceptance rates,
    SGLang's SGLANG_SIMULATE_ACC_LEN, Dynamo's --aic-nextn-accept-rates.

    Example: dspark-bench profile results/20250101-120000-sweep-abc123
    """
    from dspark_bench.engines.profiles import write_profiles  # loaded when the command runs, not for --help

    say = lambda line: out_console.print(line, highlight=False, soft_wrap=True, markup=False)  # noqa: E731
    with cli_errors():
        written, whole, policy = write_profiles(folder, out)
    say(f"{policy.label()}: {whole.rounds:,} rounds replayed, mean acceptance length {whole.mean_accept_length:.3f}")
    say("marginal (P(L ≥ i+1)): " + ", ".join(f"{x:.3f}" for x in whole.marginal))
    say("conditional (P(L ≥ i+1 | L ≥ i)): " + ", ".join(f"{x:.3f}" for x in whole.conditional))
    for name in sorted(p.name for p in written.iterdir()):
        say(f"written: {written / name}")
