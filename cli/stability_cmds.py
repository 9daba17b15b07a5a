"""`sparsepipe stability`: R trainings on different orderings -> error/density mean ± sd and Cohen's kappa."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from cli.app import app, emit_json, fail, json_line, user_errors
from cli.train_options import TrainingOptions, training_options


@app.command()
@training_options(exclude=("evaluate_every",))
def stability(
    store: Path = typer.Argument(..., help="Store made by `sparsepipe ingest` (trained on its training blocks)."),
    runs: int = typer.Option(10, min=2, help="Number of orderings (seeds S..S+R-1, S = --seed, default 0)."),
    test_store: Optional[Path] = typer.Option(None, help="Measure the error on all blocks of this store "
                                                         "(default: the holdout blocks of STORE)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    training: TrainingOptions = None,
):
    """Selection stability of ALGO: mean ± sd of error and density and mean pairwise Cohen's kappa. Takes the
    training options of `sparsepipe train` (one definition: cli/train_options.py)."""
    from pipeline.cluster import dask_client
    from pipeline.stability import stability_runs

    t = training.resolve(defaults={"paths": 1, "passes": 5, "stage_blocks": 0, "seed": 0})
    algo, opts, run = t.name, t.hyper, t.run
    workers, scheduler = run.get("workers"), run.get("scheduler")

    def progress(rec):
        if as_json:
            if not sys.stderr.isatty():  # cron and CI logs: one JSON line per run
                typer.echo(json_line({"event": "run", **rec}), err=True)
        else:
            metric = "error" if "error" in rec else "rmse"
            typer.echo(f"seed {rec['seed']:>3}  {metric} {rec[metric]:.4f}  density {rec['density']:.5f}  "
                       f"nnz {rec['nnz']:,}", err=True)

    kw = dict(runs=runs, passes=run["passes"], paths=run["paths"], stage_blocks=run["stage_blocks"],
              test_store=str(test_store) if test_store else None, progress=progress, seed=run["seed"],
              max_density=run.get("max_density"), shuffle_window=run.get("shuffle_window", 4),
              placement=run.get("placement", "paths"))
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
               f"{res['metric']} {res[res['metric'] + '_mean']:.4f} ± {res[res['metric'] + '_sd']:.4f}, "
               f"density {res['density_mean']:.5f} ± "
               f"{res['density_sd']:.5f}, kappa {res['kappa']:.4f}")
