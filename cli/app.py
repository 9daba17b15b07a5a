"""The Typer app and the helpers every command uses (errors, JSON output, progress)."""
from __future__ import annotations

import atexit
import contextlib
import gc
import json
import math
import os
import signal
import sys
import threading

import typer

# Exit codes of every command: 0 success, 1 an error in the input or the environment (one 'error: ...' line),
# 2 a usage error (options), 3/4 retrain (another run holds the lock / validation refused), 5 a corrupt store
# (a block does not match its manifest checksum or cannot be decoded), 130 interrupted (Ctrl-C), 143 SIGTERM.
EXIT_ERROR, EXIT_USAGE, EXIT_CORRUPT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 5, 130, 143
DEBUG_ENV = "SPARSEPIPE_DEBUG"


class App(typer.Typer):
    """The Typer app; an exception no command turned into a message becomes one 'error: ...' line (exit 1), or
    its traceback with ``SPARSEPIPE_DEBUG=1`` / ``--debug``."""

    def __call__(self, *args, **kwargs):
        atexit.unregister(_quick_teardown)  # once per process, however often the app is called
        atexit.register(_quick_teardown)
        with _terminate_as_interrupt():
            self._run(*args, **kwargs)

    def _run(self, *args, **kwargs):
        from typer import _click as click  # typer's own copy of click (its exceptions)

        try:
            rv = super().__call__(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as e:
            typer.echo(e.ctx.get_help() if getattr(e, "ctx", None) is not None else e.format_message(), err=True)
            sys.exit(e.exit_code)
        except click.exceptions.ClickException as e:  # usage errors: one line, exit code 2
            ctx = getattr(e, "ctx", None)
            where = f"{ctx.command_path}: " if ctx is not None else ""
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            typer.echo(f"error: {where}{' '.join(e.format_message().split())}{hint}", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(EXIT_ERROR)
        except (SystemExit, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001  the last line of defence: no traceback for users
            if debug():
                raise
            code = exit_code(e)
            typer.echo(f"error: {one_line(e)}" + ("" if code == EXIT_CORRUPT or _is_user_error(e) else
                                                  f" (an unexpected {type(e).__name__}; run with --debug or "
                                                  f"{DEBUG_ENV}=1 for the traceback to report it)"), err=True)
            sys.exit(code)
        if rv == EXIT_INTERRUPTED:  # typer's answer to a KeyboardInterrupt: Ctrl-C, or SIGTERM (Terminated)
            typer.echo(f"error: {'terminated (SIGTERM)' if _TERMINATED else 'interrupted'}; the work stopped where it "
                       f"was and cleaned up (nothing half-written is kept)", err=True)
            sys.exit(EXIT_TERMINATED if _TERMINATED else EXIT_INTERRUPTED)
        sys.exit(rv if isinstance(rv, int) else 0)


_TERMINATED: list = []  # the SIGTERM received, if any


class Terminated(KeyboardInterrupt):
    """SIGTERM (systemd's stop, `timeout`), raised where the process is, like Ctrl-C's KeyboardInterrupt, so that
    the same clean-up runs (temporary stores and block folders removed, locks released)."""


@contextlib.contextmanager
def _terminate_as_interrupt():
    """While a command runs: SIGTERM raises :class:`Terminated`, and both it and Ctrl-C are recorded in
    :mod:`pipeline.interrupt` (an exception raised inside a garbage-collection callback is lost)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from pipeline import interrupt

    def on_term(signum, frame):
        _TERMINATED.append(signum)
        interrupt.RECEIVED.append(signum)
        raise Terminated()

    def on_int(signum, frame):
        interrupt.RECEIVED.append(signum)
        raise KeyboardInterrupt()

    def unraisable(u):  # our KeyboardInterrupt raised inside a finaliser (a Dask Future's __del__): Python prints
        # "Exception ignored in ..." with a traceback; the signal is recorded and re-raised by interrupt.check
        if not (isinstance(u.exc_value, KeyboardInterrupt) and interrupt.RECEIVED):
            old_hook(u)

    interrupt.RECEIVED.clear()
    _TERMINATED.clear()
    old_term, old_int = signal.signal(signal.SIGTERM, on_term), signal.getsignal(signal.SIGINT)
    if old_int is signal.default_int_handler:  # not when the command was started with SIGINT ignored
        signal.signal(signal.SIGINT, on_int)
    old_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
        sys.unraisablehook = old_hook
        interrupt.RECEIVED.clear()  # library calls later in this process start afresh


def _quick_teardown():
    """The last exit step of a command's process: freeze the objects that exist, so that the interpreter's
    teardown does not search them for reference cycles. After numba has loaded a kernel that search takes
    ~0.1 s (its typing registries), a sixth of a small command's wall. Objects outside cycles are still
    finalised by reference counting; the OS frees the rest, as it would a moment later."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    gc.freeze()


app = App(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
          context_settings={"help_option_names": ["--help", "-h"]},
          help="Out-of-core sparse linear learning: ingest LIBSVM text into a chunked zarr store, "
               "train sparse models (SGD, truncated gradient, STSGD, ...) over its blocks with Dask "
               "and numba, evaluate on held-out blocks. Exit codes: 0 success, 1 error (one 'error:' line; "
               "--debug or SPARSEPIPE_DEBUG=1 shows the traceback), 2 usage, 5 corrupt store, 130 interrupted "
               "(Ctrl-C), 143 terminated (SIGTERM).")


@app.callback()
def _main(debug_flag: bool = typer.Option(False, "--debug", help="Show Python tracebacks of errors (as "
                                                                  "SPARSEPIPE_DEBUG=1 does), for bug reports."),
          version: bool = typer.Option(False, "--version", is_eager=True, help="Print the version and exit.",
                                       callback=lambda v: _print_version() if v else None)):
    if debug_flag:
        os.environ[DEBUG_ENV] = "1"


def _print_version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("sparsepipe")
    except PackageNotFoundError:  # run from a checkout without installing
        v = "unknown (not installed)"
    typer.echo(f"sparsepipe {v} (Python {sys.version.split()[0]})")
    raise typer.Exit(0)


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg if isinstance(e, user_errors()) else f"{type(e).__name__}: {msg}"


def _is_corrupt(e) -> bool:
    from pipeline.store.reader import StoreCorruptError

    return isinstance(e, StoreCorruptError)


def exit_code(e: BaseException) -> int:
    """The exit code of an error: 5 a corrupt store, 2 a setting that cannot work (UsageError), else 1."""
    if _is_corrupt(e):
        return EXIT_CORRUPT
    config = sys.modules.get("pipeline.config")
    return EXIT_USAGE if config is not None and isinstance(e, config.UsageError) else EXIT_ERROR


def _is_user_error(e) -> bool:
    return isinstance(e, user_errors())


def fail(msg: str, code: int = 1):
    """Print 'error: MSG' (one line) on stderr and exit with ``code``; while an exception is being handled,
    a corrupt store turns code 1 into 5 and ``--debug`` prints the traceback first."""
    exc = sys.exc_info()[1]
    if exc is not None:
        if debug():
            import traceback

            traceback.print_exc()
        if code == EXIT_ERROR:
            code = exit_code(exc)
    typer.echo(f"error: {' '.join(str(msg).split())}", err=True)
    raise typer.Exit(code)


def metric(v) -> str:
    """A holdout metric to 4 decimals; "n/a" where it has no value (the AUC of a one-class holdout: null)."""
    return f"{v:.4f}" if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"


def holdout_text(h: dict | None) -> str:
    """A model's holdout metrics for a summary line: error and AUC (binary), RMSE (regression), else ""."""
    h = h or {}
    if "error" in h:
        return f"holdout error {metric(h.get('error'))}, AUC {metric(h.get('auc'))}"
    return f"holdout RMSE {metric(h.get('rmse'))}" if "rmse" in h else ""


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, plural unless n is 1: "1 block", "3 blocks", "2 passes"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def check_choice(value: str, choices, flag: str) -> None:
    """A string option outside its choices is a usage error (exit 2) naming the flag, before any work."""
    if value not in choices:
        fail(f"{flag} must be one of {' | '.join(choices)}, got {value!r}", 2)


def check_output(path, what: str = "output file") -> None:
    """Before any work: ``path`` can be written (its directory exists and is writable; it is not a directory),
    else exit 1 naming it, instead of failing after an hour of training."""
    from pipeline.atomic import output_target

    p, streamed = output_target(os.path.abspath(os.path.expanduser(str(path))))
    if streamed:  # a FIFO or a device: written in place
        if not os.access(p, os.W_OK):
            fail(f"{path}: cannot write the {what} (permission denied)")
        return
    parent = os.path.dirname(p)
    if os.path.isdir(p):
        fail(f"{path}: is a directory; give a file name for the {what}")
    if not os.path.isdir(parent):
        fail(f"{path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        fail(f"{path}: cannot write the {what} in {parent} (permission denied)")


def _strict(o):
    """``o`` with every non-finite float as null: strict JSON (jq, JSON.parse), where json.dumps writes NaN and
    Infinity (an AUC on a one-class holdout is undefined)."""
    if isinstance(o, dict):
        return {k: _strict(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_strict(v) for v in o]
    if hasattr(o, "tolist") and hasattr(o, "ndim"):  # numpy arrays and scalars
        return _strict(o.tolist())
    return None if isinstance(o, float) and not math.isfinite(o) else o


def json_line(obj) -> str:
    """``obj`` as one line of strict JSON (numpy values as in :func:`emit_json`, non-finite floats null)."""
    from pipeline.model import json_default

    return json.dumps(_strict(obj), default=json_default, separators=(",", ":"), allow_nan=False)


def emit_json(obj) -> None:
    from pipeline.model import json_default

    typer.echo(json.dumps(_strict(obj), indent=1, default=json_default, allow_nan=False))


class Progress:
    """A progress bar on a terminal (rich), silent otherwise."""

    def __init__(self, label: str, total: float | None, unit: str = "MB", enabled: bool | None = None):
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bar = None
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self.bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                                    transient=False, console=Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task(label, total=total, info="")

    def update(self, completed: float | None = None, info: str = "") -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=completed, info=info)

    def log(self, line: str) -> None:
        """A line kept above the bar (a pass's figures), whole however wide."""
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


USER_ERROR_CLASSES = (("pipeline.ingest", "IngestError"), ("pipeline.store.format", "StoreError"),
                      ("pipeline.model", "ModelError"), ("pipeline.memory", "WorkerMemoryError"))


def user_errors():
    """Exceptions that are the user's input problem: reported as one line, exit code 1.

    Only the classes of modules already imported: an exception of a module that was never imported cannot have
    been raised, and importing ``pipeline.ingest`` to name its class would start numba (~0.6 s) before the
    error line of a command that does not use it."""
    return tuple(getattr(sys.modules[m], name) for m, name in USER_ERROR_CLASSES if m in sys.modules) + (
        ValueError, OSError)


def run_reporting(bar: Progress, fn):
    """Run ``fn()``; a user error becomes one 'error: ...' line and exit code 1; the bar is always closed."""
    try:
        return fn()
    except user_errors() as e:
        fail(str(e))
    finally:
        bar.close()


NO_VERIFY_HELP = ("Read blocks without checking them against the manifest checksums (a corrupt block then feeds "
                  "wrong numbers; the check is one XXH64 pass over a block's decoded arrays; training checks each "
                  "block on the run's first read of it). SPARSEPIPE_VERIFY=0 in the environment does the same")
REMOTE_VERIFY_HELP = "; remote workers of a --scheduler cluster check unless their own environment has it"


def no_verify_option(remote: bool = True):
    """``--no-verify``; ``remote``: the command can run on a ``--scheduler`` cluster (its help says how)."""
    return typer.Option(False, "--no-verify", help=NO_VERIFY_HELP + (REMOTE_VERIFY_HELP if remote else "") + ".")


_ENV_VERIFY: list = []  # the environment's own SPARSEPIPE_VERIFY setting, read before any command changes it


def apply_verify(no_verify: bool) -> None:
    """Checksum the blocks this command reads (and the workers it starts) unless ``--no-verify`` or the
    environment's ``SPARSEPIPE_VERIFY=0``; a command run earlier in this process does not count."""
    from pipeline.store.reader import set_verify, verify_default

    if not _ENV_VERIFY:
        _ENV_VERIFY.append(verify_default())
    set_verify(_ENV_VERIFY[0] and not no_verify)
