"""The `dspark-bench` command line: one thin module per command over the library (`run`, `decode`,
`sweep`, `analyze`, `report`, `calibrate`, `regress`, `export`, `observe`, `profile`; the groups `tasks`, `models` and
`continuations`).

Each command parses its flags, builds a config, calls one library function and prints; library
errors (DsparkError) become one line on stderr and a non-zero exit, never a traceback. Every
option is declared once: a knob or a workload setting where the library declares it, a command's
own in `options`; `declared` makes each a Typer option. `console` prints what commands share. The
command modules import only `console`, `declared` and `options` from here, and this module
registers them, so nothing imports back into the app.
"""

from __future__ import annotations

import typer

from dspark_bench.cli.analyze import analyze
from dspark_bench.cli.calibrate import calibrate
from dspark_bench.cli.console import quiet_libraries
from dspark_bench.cli.continuations import continuations_app
from dspark_bench.cli.decode import decode
from dspark_bench.cli.export import export
from dspark_bench.cli.models import models_app
from dspark_bench.cli.observe import observe
from dspark_bench.cli.profile import profile
from dspark_bench.cli.regress import regress
from dspark_bench.cli.report import report
from dspark_bench.cli.run import run
from dspark_bench.cli.sweep import sweep
from dspark_bench.cli.tasks import tasks_app

app = typer.Typer(help="Find, measure and prove the best speculative-decoding policy.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
for command in (run, decode, sweep, analyze, report, calibrate, regress, export, observe, profile):
    app.command()(command)
app.add_typer(tasks_app, name="tasks")
app.add_typer(models_app, name="models")
app.add_typer(continuations_app, name="continuations")


@app.callback()
def _setup() -> None:
    quiet_libraries()


def main() -> None:
    app()
