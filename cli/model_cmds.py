"""Model commands: train, evaluate, predict."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import List, Optional

import typer

from cli.app import Progress, app, apply_verify, emit_json, fail, no_verify_option, user_errors

RUN_KEYS = {"algo", "passes", "paths", "seed", "workers", "scheduler", "placement", "stage_blocks", "max_density",
            "record_path", "evaluate_every", "shuffle_window"}
# ablation switches: CLI flag -> (hyper-parameter, value); only for algorithms that have that parameter
SWITCHES = {"no_informative": ("truncation", "touched"), "no_stability": ("stability", False)}


def read_config(path: Path | None) -> dict:
    """Flat TOML (or a [train] table) whose keys are option names (dashes or underscores)."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except FileNotFoundError:
        fail(f"{path}: no such config file")
    except tomllib.TOMLDecodeError as e:
        fail(f"{path}: invalid TOML ({e})")
    cfg = cfg.get("train", cfg)
    return {k.replace("-", "_"): v for k, v in cfg.items() if not isinstance(v, dict)}


def check_config_keys(cfg: dict, allowed: set, path: Path | None) -> None:
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        fail(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}")


def _hyper_names(algo: str) -> set:
    import dataclasses
    import importlib

    from pipeline.algorithms import ALGORITHMS

    if algo not in ALGORITHMS:
        fail(f"unknown algorithm {algo!r}; choose one of {', '.join(sorted(ALGORITHMS))}", 2)
    mod, _, params = ALGORITHMS[algo]
    return {f.name for f in dataclasses.fields(getattr(importlib.import_module(mod), params))}


@app.command(context_settings={"help_option_names": ["--help", "-h"]})
def train(
    store: Path = typer.Argument(..., help="Store made by `sparsepipe ingest`."),
    out: Path = typer.Option(..., "--out", "-o", help="Model file to write (.npz, no pickle)."),
    algo: Optional[str] = typer.Option(None, help="sgd | tg (default tg)."),
    loss: Optional[str] = typer.Option(None, help="logistic | hinge | squared (default logistic)."),
    passes: Optional[int] = typer.Option(None, min=1, help="Passes over the training blocks (default 5)."),
    eta: Optional[float] = typer.Option(None, min=0.0, help="Learning rate (default 0.1)."),
    schedule: Optional[str] = typer.Option(None, help="constant | invscaling | sqrt (default constant)."),
    power_t: Optional[float] = typer.Option(None, min=0.0, help="Exponent of invscaling: eta / t**power_t."),
    decay: Optional[float] = typer.Option(None, min=0.0, max=1.0, help="Per-pass factor on eta (default 1)."),
    l2: Optional[float] = typer.Option(None, min=0.0, help="L2 weight decay (needs theta = inf for tg)."),
    gravity: Optional[float] = typer.Option(None, min=0.0, help="TG gravity g (L1 strength), tg only."),
    K: Optional[int] = typer.Option(None, "--K", min=1, help="TG: truncate every K steps (default 1)."),
    theta: Optional[float] = typer.Option(None, min=0.0, help="TG truncation window (default inf)."),
    paths: Optional[int] = typer.Option(None, min=1, help="Model replicas; sgd/tg split the blocks and "
                                                          "average at pass ends (default = workers)."),
    workers: Optional[int] = typer.Option(None, min=1, help="Local cluster processes (default: one thread "
                                                            "per core in this process)."),
    scheduler: Optional[str] = typer.Option(None, help="Join an existing Dask scheduler instead."),
    seed: Optional[int] = typer.Option(None, help="Seed of the block and row orders (default 0)."),
    placement: Optional[str] = typer.Option(None, help="paths: one task per path per stage (default); "
                                                       "single: the whole loop in one task (small data)."),
    init_model: Optional[Path] = typer.Option(None, help="Resume (same algo/params/paths/seed) or warm-start "
                                                         "from this model."),
    config: Optional[Path] = typer.Option(None, help="TOML file supplying any of these options."),
    max_density: Optional[float] = typer.Option(None, min=0.0, max=1.0, help="Stop before the model's density "
                                                                             "(non-zeros / features) would exceed this."),
    record_path: Optional[Path] = typer.Option(None, help="Write (stage, pass, density, holdout metrics) after "
                                                          "every pass/stage to this JSON-lines file."),
    evaluate_every: Optional[int] = typer.Option(None, min=1, help="Evaluate on the holdout every N stages."),
    shuffle_window: Optional[int] = typer.Option(None, min=1, help="Shuffle rows across this many consecutive "
                                                                   "blocks of a path's order (default 4; guards "
                                                                   "against label-sorted inputs)."),
    stage_blocks: Optional[int] = typer.Option(None, min=0, help="Multi-path algorithms: blocks per path per "
                                                                 "stage (0 = the algorithm's own stage length)."),
    no_informative: bool = typer.Option(False, "--no-informative", help="STSGD ablation: truncate only "
                                                                        "the burst's touched coordinates by g0·K."),
    no_stability: bool = typer.Option(False, "--no-stability", help="STSGD ablation: no purging."),
    fixed_gravity: Optional[float] = typer.Option(None, min=0.0, help="STSGD ablation: constant base gravity "
                                                                      "g0 (no adaptive gravity, no annealing)."),
    settings: Optional[List[str]] = typer.Option(None, "--set", help="Any hyper-parameter of the algorithm as "
                                                                      "KEY=VALUE (repeatable), e.g. --set pi0=0.8."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
    no_verify: bool = no_verify_option(),
):
    """Train a sparse linear model over the store's training blocks; report holdout metrics per pass."""
    apply_verify(no_verify)
    from pipeline.cluster import dask_client, default_workers
    from pipeline.model import load_model
    from pipeline.train import fit

    cli = {k: v for k, v in dict(algo=algo, loss=loss, passes=passes, eta=eta, schedule=schedule, power_t=power_t,
                                 decay=decay, l2=l2, gravity=gravity, K=K, theta=theta, paths=paths,
                                 workers=workers, scheduler=scheduler, seed=seed, placement=placement,
                                 max_density=max_density, record_path=record_path, evaluate_every=evaluate_every,
                                 stage_blocks=stage_blocks, fixed_gravity=fixed_gravity,
                                 shuffle_window=shuffle_window).items()
           if v is not None}
    cfg = read_config(config)
    name = cli.get("algo") or cfg.get("algo") or "tg"
    hyper = _hyper_names(name)
    check_config_keys(cfg, RUN_KEYS | hyper, config)
    for flag, on in (("no_informative", no_informative), ("no_stability", no_stability)):
        if on:
            key, val = SWITCHES[flag]
            if key not in hyper:
                fail(f"--{flag.replace('_', '-')} applies to algorithms with '{key}' (e.g. stsgd), not {name}", 2)
            cli[key] = val
    if "fixed_gravity" in cli and "fixed_gravity" not in hyper:
        fail(f"--fixed-gravity applies to stsgd, not {name}", 2)
    opts = {**cfg, **cli}
    try:
        from pipeline.algorithms import parse_setting

        opts.update(dict(parse_setting(name, s) for s in settings or []))
    except ValueError as e:
        fail(str(e), 2)
    run = {k: opts.pop(k) for k in list(opts) if k in RUN_KEYS}
    n_workers = run.get("workers") or default_workers()
    try:
        from pipeline.store.reader import open_store

        n_train = len(open_store(str(store)).entries("train"))
        n_paths = run.get("paths") or max(1, min(n_workers, n_train))
        init = load_model(init_model) if init_model else None
        if init is not None:
            init.meta["path"] = str(init_model)
        bar = Progress("train", run.get("passes", 5))

        def progress(rec):
            h = rec.get("holdout") or {}
            extra = "".join(f"{k} {v:.4g}  " for k, v in rec.items()
                            if k not in _PRINTED and isinstance(v, (int, float)))
            line = (f"pass {rec['pass']:>3}  stage {rec['stage']:>4}  nnz {rec.get('nnz', 0):>10,}  "
                    f"density {rec.get('density', 0):.4f}  {extra}" +
                    (f"holdout error {h['error']:.4f} logloss {h['logloss']:.4f}  " if 'error' in h else "") +
                    (f"holdout rmse {h['rmse']:.4f}  " if 'rmse' in h else "") + f"{rec['seconds']:.2f}s")
            if bar.bar is not None:
                bar.update(rec["pass"], line)
            elif not as_json:
                typer.echo(line, err=True)

        with dask_client(run.get("workers"), run.get("scheduler")) as client:  # neither: threads here
            model = fit(str(store), name, opts, passes=run.get("passes", 5), paths=n_paths, seed=run.get("seed", 0),
                        client=client, init_model=init, placement=run.get("placement", "paths"),
                        stage_blocks=run.get("stage_blocks", 0), max_density=run.get("max_density"),
                        evaluate_every=run.get("evaluate_every", 1),
                        shuffle_window=run.get("shuffle_window", 4), progress=progress)
        bar.close()
        model.save(out)
        if run.get("record_path"):
            _write_record(Path(run["record_path"]), model.meta["history"])
    except user_errors() as e:
        fail(str(e))
    tim = model.meta["provenance"]["timing"]
    summary = {"model": str(out), "algo": name, "passes": model.meta["passes"], "paths": n_paths,
               "seconds": model.meta["provenance"]["seconds"], "nnz": model.nnz, "density": model.density,
               "n_features": model.n_features, "holdout": model.meta.get("holdout"),
               "nnz_per_s_kernel": tim["nnz_per_s_kernel"], "copy_over_kernel": tim["copy_over_kernel"],
               "resumed": model.meta["provenance"]["resumed"], "stopped": model.meta.get("stopped")}
    if as_json:
        emit_json(summary)
    else:
        h = summary["holdout"] or {}
        typer.echo(f"{out}: {name}, {summary['passes']} passes x {n_paths} paths in {summary['seconds']:.1f}s; "
                   f"{model.nnz:,} non-zero weights (density {model.density:.4f})" +
                   (f"; holdout error {h['error']:.4f}, AUC {h['auc']:.4f}" if "error" in h else "") +
                   (f"; holdout RMSE {h['rmse']:.4f}" if "rmse" in h else ""))
        if not h:
            typer.echo(f"note: {store} has no holdout blocks; measure the model with "
                       f"`sparsepipe evaluate {out} TEST_STORE --split all`", err=True)


_PRINTED = {"pass", "stage", "nnz", "density", "seconds", "elapsed", "holdout"}


def _write_record(path: Path, history: list) -> None:
    import json

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for h in history:
            if "stopped" in h:
                continue
            ho = h.get("holdout") or {}
            f.write(json.dumps({"stage": h["stage"], "pass": h["pass"], "density": h.get("density"),
                                "nnz": h.get("nnz"), **{f"holdout_{k}": v for k, v in ho.items()}}) + "\n")
    os.replace(tmp, path)


@app.command()
def evaluate(
    model: Path = typer.Argument(..., help="Model file."),
    store: Path = typer.Argument(..., help="Store to evaluate on (may be wider than the model)."),
    split: str = typer.Option("holdout", help="holdout | train | all."),
    workers: Optional[int] = typer.Option(None, min=1, help="Local cluster processes (default: in-process)."),
    scheduler: Optional[str] = typer.Option(None, help="Join an existing Dask scheduler."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    no_verify: bool = no_verify_option(),
):
    """Error rate, AUC, log-loss, hinge (RMSE for regression), non-zeros and density of MODEL on STORE."""
    apply_verify(no_verify)
    from pipeline.cluster import dask_client
    from pipeline.evaluate import evaluate_store
    from pipeline.model import load_model

    try:
        m = load_model(model)
        if workers or scheduler:
            with dask_client(workers, scheduler) as client:
                res = evaluate_store(m, str(store), split, client)
        else:
            res = evaluate_store(m, str(store), split)
    except user_errors() as e:
        fail(str(e))
    res["model"] = str(model)
    if as_json:
        emit_json(res)
        return
    keys = ["n_rows", "error", "auc", "logloss", "hinge", "rmse", "mae", "nnz", "density"]
    for k in keys:
        if k in res:
            v = res[k]
            typer.echo(f"{k:<10} {v:,}" if isinstance(v, int) else f"{k:<10} {v:.6g}")


@app.command()
def predict(
    model: Path = typer.Argument(..., help="Model file."),
    input: Path = typer.Argument(..., help="LIBSVM text file or a store (all blocks, row order)."),
    out: Path = typer.Option(..., "--out", "-o", help="Output: one line per row, 'label score'."),
    zero_based: bool = typer.Option(False, "--zero-based", help="LIBSVM input indices start at 0."),
    no_verify: bool = no_verify_option(),
):
    """Scores and predicted labels for every row of INPUT."""
    apply_verify(no_verify)
    from pipeline.model import load_model
    from pipeline.predict import predict_to_file

    try:
        n = predict_to_file(load_model(model), str(input), str(out), zero_based=zero_based)
    except user_errors() as e:
        fail(str(e))
    typer.echo(f"{out}: {n:,} predictions")
