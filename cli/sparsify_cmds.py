"""Model post-processing commands: sparsify (ALGORITHMS.md §3 stage 2, randomized sparsification) and refit
(ALGORITHMS.md §8, relaxed lasso on the support)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.app import (Progress, app, apply_verify, check_choice, check_output, count, emit_json, fail, holdout_text,
                     no_verify_option, user_errors)
from cli.model_cmds import refit_option, refit_options


@app.command()
def sparsify(
    model: Path = typer.Argument(..., help="Model file (any algorithm)."),
    store: Path = typer.Option(..., "--store", help="Store whose training-split feature statistics give "
                                                    "E[x_j^2] (the DD probabilities and the bounds)."),
    out: Path = typer.Option(..., "--out", "-o", help="Sparse model file to write."),
    nnz: Optional[int] = typer.Option(None, min=1, help="With --nnz-mode draws (the default, unbiased): K = N draws, "
                                                        "at most N non-zeros; with distinct: exactly N non-zeros."),
    epsilon: Optional[float] = typer.Option(None, help="Excess squared-loss risk allowed (> 0): "
                                                       "K = ceil(C / (epsilon delta)) draws (TS-9)."),
    delta: float = typer.Option(0.1, min=0.0, max=1.0, help="Failure probability for --epsilon."),
    method: str = typer.Option("dd", help="dd: p_j ~ |w_j| sqrt(E[x_j^2]) | mg: p_j ~ |w_j|."),
    nnz_mode: str = typer.Option("draws", help="draws: K = nnz draws (unbiased, nnz <= K) | distinct: draw "
                                               "until nnz distinct coordinates (nnz exact)."),
    seed: int = typer.Option(0, help="Seed of the draws."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
    no_verify: bool = no_verify_option(remote=False),
):
    """Turn MODEL into a sparse model by randomized sparsification; records what it did in the model's meta."""
    apply_verify(no_verify)
    check_output(out, "model")
    from pipeline.model import load_model
    from pipeline.sparsify import METHODS, NNZ_MODES, sparsify_model

    check_choice(method, METHODS, "--method")
    check_choice(nnz_mode, NNZ_MODES, "--nnz-mode")
    if (nnz is None) == (epsilon is None):
        fail("give exactly one of --nnz and --epsilon", 2)
    if epsilon is not None and not 0 < epsilon < float("inf"):
        fail(f"--epsilon must be a finite number > 0, got {epsilon}", 2)
    try:
        m = load_model(model)
        sm = sparsify_model(m, str(store), method=method, nnz=nnz, epsilon=epsilon, delta=delta, seed=seed,
                            nnz_mode=nnz_mode)
        sm.meta["sparsify"]["input_model"] = str(model)
        sm.save(out)
    except user_errors() as e:
        fail(str(e))
    info = {"model": str(out), **sm.meta["sparsify"]}
    if as_json:
        emit_json(info)
    else:
        typer.echo(f"{out}: {info['method']} sparsification of {model} ({info['source']}), K = {info['K']:,} "
                   f"draws, {info['nnz_before']:,} -> {info['nnz']:,} non-zeros; expected excess risk bound "
                   f"{info['excess_bound']:.4g}")


@app.command()
def refit(
    model: Path = typer.Argument(..., help="Model file (any algorithm; its non-zero weights are the support S)."),
    store: Path = typer.Argument(..., help="Store whose training blocks the refit reads (holdout: metrics only)."),
    out: Path = typer.Option(..., "--out", "-o", help="Refitted model file to write."),
    l1: str = refit_option("l1", "--l1", "auto"),
    l2: Optional[float] = refit_option("l2", "--l2"),
    iters: Optional[int] = refit_option("iters", "--iters"),
    kkt: Optional[int] = refit_option("kkt", "--kkt"),
    relax: bool = refit_option("relax", "--relax"),
    adaptive: bool = refit_option("adaptive", "--adaptive/--no-adaptive"),
    select: Optional[str] = refit_option("select", "--select"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Start a local cluster of N processes "
                                                                         "(default: threads in this process)."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="Join this Dask scheduler instead."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
    no_verify: bool = no_verify_option(),
):
    """Refit MODEL on its own support over STORE's training blocks (what `train --refit` does after training):
    the exact elastic-net solve on S, then holdout metrics. The input model is not changed."""
    apply_verify(no_verify)
    check_output(out, "model")
    import numpy as np

    from pipeline.cluster import dask_client
    from pipeline.model import load_model
    from pipeline.refit import fits_here, support_stats
    from pipeline.store.order import model_external, model_internal
    from pipeline.store.reader import open_store
    from pipeline.train import refit_model

    options = refit_options(True, l2, iters, l1, kkt, relax, adaptive, select, l1_flag="--l1", select_flag="--select",
                            kkt_flag="--kkt", relax_flag="--relax", adaptive_flag="--no-adaptive")
    try:
        st = open_store(str(store))
        m = model_internal(load_model(model), st)  # the support in the blocks' ids (its statistics, its refit)
        prov = m.meta.get("provenance") or {}
        blocks = prov.get("blocks")  # a model trained on a window: the same rows
        if prov.get("store_id") and prov["store_id"] != st.manifest["store_id"]:
            blocks = None  # block keys name other rows in another store; "before" was measured on the model's store
            m.meta["holdout"] = None
            typer.echo(f"note: {model} was trained on {prov.get('store', 'another store')}, not {store}: refitting "
                       f"on all of {store}'s training blocks", err=True)
        if blocks and not st.entries("holdout", blocks):  # retrain's models list the window's training blocks only:
            gens = {int(st.entry(k).get("generation", 1)) for k in blocks}  # their generations' holdout too
            blocks = list(blocks) + st.keys("holdout", gens)
        if workers and not scheduler:
            options["stats"] = support_stats(st, np.sort(m.coef_indices))  # read once, here and in the refit
            if fits_here(st, m.coef_indices, blocks, counts=options["stats"][0]):
                workers = None  # it would run on this process's threads anyway: no cluster to start (refit_client)
        bar = Progress("refit", None)
        if bar.bar is not None:
            options["progress"] = lambda n: bar.update(info=f"{count(n, 'pass', 'passes')} over the support")
        try:
            with dask_client(workers, scheduler) as client:
                r = refit_model(m, st, client, blocks, True, options)
        finally:
            bar.close()
        r = model_external(r, st)
        r.meta["refit"]["input_model"] = str(model)
        r.save(out)
    except user_errors() as e:
        fail(str(e))
    info = {k: v for k, v in r.meta["refit"].items() if k != "l1_path"}
    summary = {"model": str(out), "holdout": r.meta.get("holdout"), "density": r.density, **info}
    if as_json:
        emit_json(summary)
        return
    h, hb = holdout_text(r.meta.get("holdout")), holdout_text(info.get("holdout_before"))
    typer.echo(f"{out}: refit of {model} ({info['loss']}, l1 {info['l1']:g}, l2 {info['l2']:g}): "
               f"{info['nnz_before']:,} -> {r.nnz:,} non-zeros, {info['evaluations']:,} passes in {info['seconds']:.1f}s"
               + (f"; {h}" if h else "") + (f" (before: {hb})" if h and hb else ""))
