"""Nightly retraining and the model registry: `retrain`, `registry list|show|promote|rollback`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from cli.app import app, apply_verify, emit_json, exit_code, fail, no_verify_option, user_errors

registry_app = typer.Typer(no_args_is_help=True, help="Model registry: versions, production pointer, rollback.")
app.add_typer(registry_app, name="registry")


def _parse_value(v: str):
    import tomllib

    try:
        return tomllib.loads(f"x = {v}")["x"]
    except tomllib.TOMLDecodeError:
        return v


@app.command(context_settings={"help_option_names": ["--help", "-h"]})
def retrain(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="JOB.toml: store, registry, \\[train], \\[gate], "
                                                                       "\\[window], \\[retention], \\[validation], \\[ingest]."),
    new: Optional[List[str]] = typer.Option(None, "--new", help="New input file or URL for tonight (repeatable)."),
    store: Optional[str] = typer.Option(None, help="Store (JOB.toml: store)."),
    registry: Optional[str] = typer.Option(None, help="Registry directory (JOB.toml: registry)."),
    algo: Optional[str] = typer.Option(None, help="\\[train] algo."),
    passes: Optional[int] = typer.Option(None, min=1, help="\\[train] passes per night (default: 3 when the job "
                                         "refits, else 5; the shipped nightly.toml: 2)."),
    workers: Optional[int] = typer.Option(None, min=0, help="\\[train] workers (0: train in this process)."),
    scheduler: Optional[str] = typer.Option(None, help="\\[train] scheduler: join an existing Dask cluster."),
    paths: Optional[int] = typer.Option(None, min=1, help="\\[train] paths."),
    seed: Optional[int] = typer.Option(None, help="\\[train] seed."),
    metric: Optional[str] = typer.Option(None, help="\\[gate] metric: error | auc | logloss | rmse."),
    max_change: Optional[float] = typer.Option(None, help="\\[gate] max_change (absolute, worse direction)."),
    max_density: Optional[float] = typer.Option(None, min=0.0, max=1.0, help="\\[gate] max_density."),
    min_auc: Optional[float] = typer.Option(None, help="\\[gate] min_auc."),
    max_error: Optional[float] = typer.Option(None, help="\\[gate] max_error."),
    generations: Optional[int] = typer.Option(None, min=0, help="\\[window] generations: train on the last N (0: all)."),
    keep: Optional[int] = typer.Option(None, min=1, help="\\[retention] keep: model versions kept."),
    settings: Optional[List[str]] = typer.Option(None, "--set", help="Any JOB.toml key as SECTION.KEY=VALUE "
                                                                      "(e.g. train.eta=0.5, validation.max_unseen_share=0.8)."),
    force: bool = typer.Option(False, "--force", help="Train on a new generation that validation refuses (recorded)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    no_verify: bool = no_verify_option(),
):
    """Nightly job: append --new inputs, validate them, warm-start a candidate from production, evaluate both on
    the newest holdout blocks, promote through the gate, apply retention. Safe to re-run and to kill.

    Exit codes: 0 finished (promoted or kept production), 3 another run holds the lock, 4 validation refused the
    new generation, 1 error, 2 a bad option or job file, 5 a corrupt store."""
    apply_verify(no_verify)
    from pipeline.registry import RegistryError
    from pipeline.retrain import JobError, load_job, run_job

    ov: dict = {"store": store, "registry": registry,
                "train": {k: v for k, v in dict(algo=algo, passes=passes, workers=workers, scheduler=scheduler,
                                                 paths=paths, seed=seed).items() if v is not None},
                "gate": {k: v for k, v in dict(metric=metric, max_change=max_change, max_density=max_density,
                                                min_auc=min_auc, max_error=max_error).items() if v is not None},
                "window": {"generations": generations} if generations is not None else {},
                "retention": {"keep": keep} if keep is not None else {}}
    for s in settings or []:
        key, eq, val = s.partition("=")
        sec, dot, name = key.strip().partition(".")
        if not eq:
            fail(f"--set {s!r}: expected SECTION.KEY=VALUE", 2)
        if not dot:
            ov[sec.replace("-", "_")] = _parse_value(val)
        else:
            ov.setdefault(sec, {})[name.strip().replace("-", "_")] = _parse_value(val)
    try:
        cfg = load_job(config, ov)
    except ValueError as e:
        fail(str(e), 2)
    tty = sys.stderr.isatty() and not as_json

    def progress(step, msg):
        if tty:
            typer.echo(f"[{step}] {msg}", err=True)

    try:
        code, res = run_job(cfg, new, force=force, progress=progress)
    except (JobError, RegistryError, *user_errors()) as e:
        if as_json:
            emit_json({"status": "error", "error": str(e), "exit_code": exit_code(e)})
        fail(str(e), 1)
    if as_json:
        emit_json(res)
    else:
        typer.echo(_summary(res))
    raise typer.Exit(code)


def _summary(res: dict) -> str:
    st = res.get("status")
    if st == "locked":
        return f"retrain: not run: {res['error']}"
    secs = res.get("seconds", {})
    tail = f" ({secs.get('total', 0):.1f}s: " + ", ".join(f"{k} {v:.1f}s" for k, v in secs.items() if k != "total") + ")"
    if st == "refused":
        return (f"retrain {res['run']}: REFUSED generation {res.get('generation')}: {res['reason']}" + tail +
                "; if the night is right, re-run with --force (or widen the bound: --set validation.KEY=VALUE)")
    if st == "noop":
        return f"retrain {res['run']}: already done ({res.get('earlier_status')}: {res.get('reason')}); nothing to do"
    c, v = res["candidate"], res["versions"]
    m = res.get("candidate", {}).get("metrics", {})
    return (f"retrain {res['run']}: {st.upper()} version {c['version']} (production now v{v['production']}); "
            f"{res['reason']}; +{res.get('rows_appended', 0):,} rows, window generations "
            f"{res['window']['generations']}, nnz {m.get('nnz')}" + tail)


# ---------------------------------------------------------------------------------------------- registry

def _open(path):
    from pipeline.registry import RegistryError, open_registry

    try:
        return open_registry(path)
    except RegistryError as e:
        fail(str(e))


def _brief(r: dict) -> dict:
    return {"version": r["version"], "path": r["path"], "production": r["production"], "decision": r["decision"],
            "reason": r.get("reason"), "metrics": r.get("metrics"), "production_metrics": r.get("production_metrics"),
            "created": r["created"], "parent": r.get("parent"), "generations": r.get("generations"),
            "algorithm": r.get("algorithm"), "nnz": r.get("nnz"), "density": r.get("density"), "run": r.get("run")}


@registry_app.command("list")
def registry_list(registry: Path = typer.Argument(..., help="Registry directory."),
                  as_json: bool = typer.Option(False, "--json", help="Print a JSON list.")):
    """Model versions, oldest first: production flag, decision, holdout metrics."""
    from pipeline.registry import RegistryError

    reg = _open(registry)
    try:
        rows = [_brief(r) for r in reg.versions()]
    except RegistryError as e:
        fail(str(e))
    if as_json:
        emit_json(rows)
        return
    typer.echo(f"{'ver':>4} {'prod':<4} {'decision':<9} {'error':>7} {'auc':>7} {'nnz':>9}  {'created':<24} gens")
    for r in rows:
        m = r["metrics"] or {}
        f = lambda k: f"{m[k]:.4f}" if isinstance(m.get(k), float) else "-"  # noqa: E731
        typer.echo(f"{r['version']:>4} {'*' if r['production'] else '':<4} {r['decision']:<9} {f('error'):>7} "
                   f"{f('auc'):>7} {r['nnz'] or 0:>9,}  {r['created']:<24} {r['generations']}")


@registry_app.command("show")
def registry_show(registry: Path = typer.Argument(..., help="Registry directory."),
                  version: int = typer.Argument(..., help="Version number."),
                  as_json: bool = typer.Option(True, "--json", hidden=True,
                                               help="Accepted for symmetry with the other commands: the output is "
                                                    "JSON either way.")):
    """Everything the index records about one version (JSON)."""
    from pipeline.registry import RegistryError

    reg = _open(registry)
    try:
        emit_json(reg.version(version))
    except RegistryError as e:
        fail(str(e))


@registry_app.command("promote")
def registry_promote(registry: Path = typer.Argument(..., help="Registry directory."),
                     version: int = typer.Argument(..., help="Version to put in production."),
                     as_json: bool = typer.Option(False, "--json", help="Print the move as JSON.")):
    """Move the production pointer to VERSION (atomic; recorded in the run log)."""
    from pipeline.registry import RegistryError

    reg = _open(registry)
    try:
        with reg.lock(run=f"promote-{version}"):
            res = reg.promote(version, run=None, reason="manual promote")
    except RegistryError as e:
        fail(str(e), 3 if "holds the lock" in str(e) else 1)
    if as_json:
        emit_json(res)
    elif res["changed"]:
        typer.echo(f"production: v{res['production']} (was v{res['previous']})")
    else:
        typer.echo(f"production: v{res['production']} already; nothing changed")


@registry_app.command("rollback")
def registry_rollback(registry: Path = typer.Argument(..., help="Registry directory."),
                      as_json: bool = typer.Option(False, "--json", help="Print the move as JSON.")):
    """Move production back to the previous production version (atomic; recorded in the run log)."""
    from pipeline.registry import RegistryError

    reg = _open(registry)
    try:
        with reg.lock(run="rollback"):
            res = reg.rollback()
    except RegistryError as e:
        fail(str(e), 3 if "holds the lock" in str(e) else 1)
    emit_json(res) if as_json else typer.echo(f"production: v{res['production']} (was v{res['from']})")
