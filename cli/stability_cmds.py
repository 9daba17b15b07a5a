"""`sparsepipe stability`: R trainings on different orderings -> error/density mean ± sd and Cohen's kappa."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from cli.app import app, apply_verify, emit_json, fail, no_verify_option, user_errors


@app.command()
def stability(
    store: Path = typer.Argument(..., help="Store made by `sparsepipe ingest` (trained on its training blocks)."),
    algo: str = typer.Option("tg", help="Any registered algorithm (sgd, tg, stsgd, ...)."),
    runs: int = typer.Option(10, min=2, help="Number of orderings (seeds 0..R-1)."),
    passes: int = typer.Option(5, min=1, help="Passes per run."),
    paths: int = typer.Option(1, min=1, help="Paths (model replicas) per run."),
    workers: Optional[int] = typer.Option(None, min=1, help="Local cluster processes (default: in-process)."),
    scheduler: Optional[str] = typer.Option(None, help="Join an existing Dask scheduler."),
    stage_blocks: int = typer.Option(0, min=0, help="Full-path algorithms: blocks per path per stage."),
    test_store: Optional[Path] = typer.Option(None, help="Measure the error on all blocks of this store "
                                                         "(default: the holdout blocks of STORE)."),
    settings: Optional[List[str]] = typer.Option(None, "--set", help="Hyper-parameter KEY=VALUE (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    no_verify: bool = no_verify_option(),
):
    """Selection stability of ALGO: mean ± sd of error and density and mean pairwise Cohen's kappa."""
    apply_verify(no_verify)
    from pipeline.algorithms import parse_setting
    from pipeline.cluster import dask_client
    from pipeline.stability import stability_runs

    try:
        opts = dict(parse_setting(algo, s) for s in settings or [])
    except ValueError as e:
        fail(str(e), 2)

    def progress(rec):
        if not as_json:
            typer.echo(f"seed {rec['seed']:>3}  error {rec['error']:.4f}  density {rec['density']:.5f}  "
                       f"nnz {rec['nnz']:,}", err=True)

    kw = dict(runs=runs, passes=passes, paths=paths, stage_blocks=stage_blocks,
              test_store=str(test_store) if test_store else None, progress=progress)
    try:
        if workers or scheduler:
            with dask_client(workers, scheduler) as client:
                res = stability_runs(str(store), algo, opts, client=client, **kw)
        else:
            res = stability_runs(str(store), algo, opts, **kw)
    except user_errors() as e:
        fail(str(e))
    if as_json:
        emit_json(res)
        return
    typer.echo(f"{algo} over {runs} orderings ({res['split']} of {res['test_store'] or res['store']}): "
               f"error {res['error_mean']:.4f} ± {res['error_sd']:.4f}, density {res['density_mean']:.5f} ± "
               f"{res['density_sd']:.5f}, kappa {res['kappa']:.4f}")
