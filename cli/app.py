"""The Typer app and the helpers every command uses (errors, JSON output, progress)."""
from __future__ import annotations

import json
import sys
import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Out-of-core sparse linear learning: ingest LIBSVM text into a chunked zarr store, "
                       "train sparse models (SGD, truncated gradient, STSGD, ...) over its blocks with Dask "
                       "and numba, evaluate on held-out blocks.")


def fail(msg: str, code: int = 1):
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code)


def emit_json(obj) -> None:
    from pipeline.model import json_default

    typer.echo(json.dumps(obj, indent=1, default=json_default))


class Progress:
    """A progress bar on a terminal (rich), silent otherwise."""

    def __init__(self, label: str, total: float | None, unit: str = "MB", enabled: bool | None = None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar = None
        if self.enabled:
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self.bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                    transient=False, console=None)
            self.bar.start()
            self.task = self.bar.add_task(label, total=total, info="")

    def update(self, completed: float, info: str = "") -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=completed, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def user_errors():
    """Exceptions that are the user's input problem: reported as one line, exit code 1."""
    from pipeline.ingest import IngestError
    from pipeline.model import ModelError
    from pipeline.store.format import StoreError

    return (IngestError, StoreError, ModelError, ValueError, FileNotFoundError)




def run_reporting(bar: Progress, fn):
    """Run ``fn()``; a user error becomes one 'error: ...' line and exit code 1; the bar is always closed."""
    try:
        return fn()
    except user_errors() as e:
        fail(str(e))
    finally:
        bar.close()
