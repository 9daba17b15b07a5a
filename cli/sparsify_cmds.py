"""Model post-processing command: sparsify (ALGORITHMS.md §3 stage 2, randomized sparsification)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.app import app, apply_verify, emit_json, fail, no_verify_option, user_errors


@app.command()
def sparsify(
    model: Path = typer.Argument(..., help="Model file (any algorithm)."),
    store: Path = typer.Option(..., "--store", help="Store whose training-split feature statistics give "
                                                    "E[x_j^2] (the DD probabilities and the bounds)."),
    out: Path = typer.Option(..., "--out", "-o", help="Sparse model file to write."),
    nnz: Optional[int] = typer.Option(None, min=1, help="Target number of non-zeros (see --nnz-mode)."),
    epsilon: Optional[float] = typer.Option(None, min=0.0, help="Excess squared-loss risk allowed: "
                                                                "K = ceil(C / (epsilon delta)) draws (TS-9)."),
    delta: float = typer.Option(0.1, min=0.0, max=1.0, help="Failure probability for --epsilon."),
    method: str = typer.Option("dd", help="dd: p_j ~ |w_j| sqrt(E[x_j^2]) | mg: p_j ~ |w_j|."),
    nnz_mode: str = typer.Option("draws", help="draws: K = nnz draws (unbiased, nnz <= K) | distinct: draw "
                                               "until nnz distinct coordinates (nnz exact)."),
    seed: int = typer.Option(0, help="Seed of the draws."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
    no_verify: bool = no_verify_option(),
):
    """Turn MODEL into a sparse model by randomized sparsification; records what it did in the model's meta."""
    apply_verify(no_verify)
    from pipeline.model import load_model
    from pipeline.sparsify import sparsify_model

    if (nnz is None) == (epsilon is None):
        fail("give exactly one of --nnz and --epsilon", 2)
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
