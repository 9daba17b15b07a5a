"""Model commands: train, evaluate, predict."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.app import (Progress, app, apply_verify, check_choice, check_output, count, emit_json, fail, holdout_text,
                     json_line, metric, no_verify_option, user_errors)
from cli.train_options import RUN_KEYS, SWITCHES, TrainingOptions, read_config, training_options  # noqa: F401


# The refit's options, shared by `train` (--refit-*) and `sparsepipe refit` (--l1, ...): default, bounds, help.
_REFIT_OPTIONS = {
    "l1": (None, {}, "L1 penalty of the refit on the mean loss: 'auto' (default: a path fitted on 80% of the "
                     "training rows, chosen on the other 20%; the plain L2 refit at >= 20 training rows per "
                     "selected column) or a number; 0 refits with L2 only (fewer passes over the store)."),
    "l2": (None, {"min": 0.0}, "L2 penalty of the refit on the mean loss (default 3e-3 / training rows: 1e-7 at "
                               "31k rows; with the 'auto' L1 penalty the validation rows choose between that and a "
                               "tenth of it)."),
    "iters": (None, {"min": 1}, "L-BFGS-B iterations of the refit's final fit at most (default 300; it stops earlier at its tolerance)."),
    "relax": (False, {}, "With the 'auto' L1 penalty, also score Meinshausen's relaxed fits (phi x lambda on the "
                         "lasso's support at lambda, phi 1/2, 1/4, 1/8): sparser models at equal validation loss "
                         "on large sets, for twice the passes; less reliable on small ones."),
    "adaptive": (True, {}, "With the 'auto' L1 penalty, also fit Zou's adaptive lasso on the chosen lasso's "
                           "support (penalty weights max|w|/|w_j|), a candidate when it beats the lasso's validation "
                           "loss by more than its standard error: fewer false features and less shrinkage (35k "
                           "webspam-like rows: 9.34% error at 1,853 non-zeros against the lasso's 9.84% at 3,692)."),
    "select": (None, {}, "With the 'auto' L1 penalty, how the validation rows choose among the path's fits (the "
                         "sparsest accepted): 'paired' (default) not worse than the lowest validation loss by more "
                         "than the standard error of the two fits' per-row differences; 'min' the lowest; 'one-se' "
                         "within one standard error of the mean loss (glmnet's lambda.1se: sparser, and worse where "
                         "the validation rows are few)."),
    "kkt": (None, {"min": 0}, "After an L1 refit, check its KKT conditions on every column (a pass over the full "
                              "rows) and let up to N rounds add violating columns to the support (0: report only)."),
}


def refit_option(name: str, flag: str, default=...):
    """The typer option of the refit setting ``name`` (a key of _REFIT_OPTIONS) under ``flag``."""
    dflt, bounds, text = _REFIT_OPTIONS[name]
    return typer.Option(dflt if default is ... else default, flag, help=text, **bounds)


@app.command(context_settings={"help_option_names": ["--help", "-h"]})
@training_options()
def train(
    store: Path = typer.Argument(..., help="Store made by `sparsepipe ingest`."),
    out: Path = typer.Option(..., "--out", "-o", help="Model file to write (.npz, no pickle)."),
    init_model: Optional[Path] = typer.Option(None, help="Resume (same algo/params/paths/seed) or warm-start "
                                                         "from this model (a refitted model: from its sparse "
                                                         "learner's weights, which the file keeps)."),
    record_path: Optional[Path] = typer.Option(None, help="Write (stage, pass, density, holdout metrics) after "
                                                          "every pass/stage to this JSON-lines file."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary (and, when stderr is not a "
                                                       "terminal, one JSON line per pass on stderr)."),
    refit: Optional[bool] = typer.Option(None, "--refit/--no-refit",
                                         help="After training, refit the model on the selected support only "
                                              "(relaxed lasso: exact full-batch L-BFGS-B over the store, L1 "
                                              "penalty chosen on 20% of the training rows, see --refit-l1). "
                                              "Default: on for stsgd, off for the others. Loss: the model's "
                                              "when logistic or squared; hinge-trained models are refitted "
                                              "with logistic loss. Holdout metrics are then the refitted "
                                              "model's; the file keeps the learner's state for --init-model."),
    refit_l1: Optional[str] = refit_option("l1", "--refit-l1"),
    refit_kkt: Optional[int] = refit_option("kkt", "--refit-kkt"),
    refit_relax: bool = refit_option("relax", "--refit-relax"),
    refit_adaptive: bool = refit_option("adaptive", "--refit-adaptive/--no-refit-adaptive"),
    refit_select: Optional[str] = refit_option("select", "--refit-select"),
    refit_l2: Optional[float] = refit_option("l2", "--refit-l2"),
    refit_iters: Optional[int] = refit_option("iters", "--refit-iters"),
    training: TrainingOptions = None,
):
    """Train a sparse linear model over the store's training blocks; report holdout metrics per pass.

    --algo names every algorithm; `sparsepipe algorithms [NAME]` describes each with its hyper-parameters
    (set any with --set KEY=VALUE)."""
    from pipeline.cluster import dask_client, default_workers
    from pipeline.model import load_model
    from pipeline.refit import refit_by_default
    from pipeline.train import default_passes, fit

    t = training.resolve()
    name, opts, run = t.name, t.hyper, t.run
    if record_path is not None:
        run["record_path"] = record_path
    check_output(out, "model")
    if run.get("record_path"):
        check_output(run["record_path"], "record")
    n_workers = run.get("workers") or default_workers()
    try:
        from pipeline.store.reader import open_store

        st = open_store(str(store))
        n_train = len(st.entries("train"))
        from pipeline.algorithms import default_paths

        n_paths = run.get("paths") or default_paths(name, n_workers, n_train)
        if run.get("workers") and not run.get("scheduler"):  # refuse what cannot fit before starting the workers
            from pipeline.algorithms import make_algorithm
            from pipeline.memory import check_local

            check_local(make_algorithm(name, dict(opts)), st.n_features, n_paths, run["workers"])
        init = load_model(init_model) if init_model else None
        if init is not None:
            init.meta["path"] = str(init_model)

        def progress(rec):
            h = rec.get("holdout") or {}
            extra = "".join(f"  {k} {_figure(v)}" for k, v in rec.items()
                            if k not in _PRINTED and isinstance(v, (int, float)))
            line = (f"pass {rec['pass']:>3}  stage {rec['stage']:>4}  nnz {rec.get('nnz', 0):>10,}  "
                    f"density {rec.get('density', 0):.4f}  " +
                    (f"holdout error {metric(h.get('error'))} logloss {metric(h.get('logloss'))}  " if 'error' in h else "") +
                    (f"holdout rmse {metric(h.get('rmse'))}  " if 'rmse' in h else "") + f"{rec['seconds']:.2f}s" + extra)
            if bar.bar is not None:  # a terminal: the whole line kept above the bar
                bar.log(line)
                bar.update(rec["pass"], f"pass {rec['pass']}")
            elif as_json:  # not a terminal: one JSON line per pass for cron and CI logs
                typer.echo(json_line({"event": "pass", **rec}), err=True)
            else:
                typer.echo(line, err=True)

        refitting = refit_options(refit_by_default(name) if refit is None else refit, refit_l2, refit_iters,
                                  refit_l1, refit_kkt, refit_relax, refit_adaptive, refit_select)
        passes = run.get("passes") or default_passes(refitting is not None)
        bar = Progress("train", passes)
        if refitting is not None and bar.bar is not None:
            refitting["progress"] = lambda n: bar.update(info=f"refit on the support: {count(n, 'pass', 'passes')}")
        elif refitting is not None:  # a log: a line every few seconds of a refit that may take minutes
            from pipeline.refit import every_few_seconds

            refitting["progress"] = every_few_seconds(lambda n, s: typer.echo(
                json_line({"event": "refit", "passes": n, "seconds": round(s, 1)}) if as_json else
                f"refit on the support: {count(n, 'pass', 'passes')} in {s:.1f}s", err=True))
        try:
            with dask_client(run.get("workers"), run.get("scheduler")) as client:  # neither: threads here
                model = fit(str(store), name, opts, passes=passes, paths=n_paths,
                            seed=run.get("seed", 0), client=client, init_model=init,
                            placement=run.get("placement", "paths"), stage_blocks=run.get("stage_blocks", 0),
                            max_density=run.get("max_density"), evaluate_every=run.get("evaluate_every", 1),
                            shuffle_window=run.get("shuffle_window", 4), progress=progress, refit=refitting,
                            blocks=_window(str(store), run.get("generations", 0)))
        finally:  # also on Ctrl-C: the terminal gets its cursor back before the error line
            bar.close()
        if model.meta.get("stopped") == "diverged":
            bad = next((h["pass"] for h in model.meta["history"] for k in ("logloss", "rmse")
                        if k in (h.get("holdout") or {}) and metric(h["holdout"][k]) == "n/a"), None)
            fail(f"--algo {name} diverged" + (f" (its holdout metrics were not finite from pass {bad})" if bad else "")
                 + f": its weights overflowed, so the model is not saved; a smaller step keeps them finite "
                 f"(`sparsepipe algorithms {name}` lists its step parameters)")
        if model.meta["provenance"].get("after_stop"):
            whose = "its sparse learner's" if model.meta["provenance"].get("warm_from") == "learner" else "its"
            typer.echo(f"note: {init_model}'s training had ended by {name}'s stopping rule, so it is final; this "
                       f"run warm-started from {whose} weights instead of resuming it", err=True)
        if run.get("record_path"):  # first: a record that cannot be written leaves no model either
            _write_record(Path(run["record_path"]), model.meta["history"])
        model.save(out)
    except user_errors() as e:
        fail(str(e))
    tim = model.meta["provenance"]["timing"]
    summary = {"model": str(out), "algo": name, "passes": model.meta["passes"], "paths": n_paths,
               "seconds": model.meta["provenance"]["seconds"], "nnz": model.nnz, "density": model.density,
               "n_features": model.n_features, "holdout": model.meta.get("holdout"),
               "nnz_per_s_kernel": tim["nnz_per_s_kernel"], "copy_over_kernel": tim["copy_over_kernel"],
               "resumed": model.meta["provenance"]["resumed"], "warm_from": model.meta["provenance"].get("warm_from"),
               "stopped": model.meta.get("stopped")}
    if model.meta.get("refit"):
        summary["refit"] = {k: model.meta["refit"].get(k) for k in _REFIT_SUMMARY}
    if as_json:
        emit_json(summary)
    else:
        h = holdout_text(summary["holdout"])
        typer.echo(f"{out}: {name}, {count(summary['passes'], 'pass', 'passes')} x {count(n_paths, 'path')} in "
                   f"{summary['seconds']:.1f}s; {model.nnz:,} non-zero weights (density {model.density:.4f})"
                   + (f"; {h}" if h else ""))
        if "refit" in summary:
            r, hb = summary["refit"], holdout_text(summary["refit"]["holdout_before"])
            typer.echo(f"refit ({r['loss']}, l1 {r['l1']:g}, l2 {r['l2']:g}): {r['nnz_before']:,} -> {model.nnz:,} "
                       f"non-zeros, {r['iterations']:,} iterations, {r['evaluations']:,} passes in {r['seconds']:.1f}s"
                       + (f"; before refit: {hb}" if hb else ""))
        if not summary["holdout"]:
            typer.echo(f"note: {store} has no holdout blocks; measure the model with "
                       f"`sparsepipe evaluate {out} TEST_STORE --split all`", err=True)


def _window(store: str, last: int):
    """Block keys (training and holdout) of the newest ``last`` generations; None for all."""
    if not last:
        return None
    from pipeline.store.reader import open_store

    st = open_store(store)
    gens = st.window(last)
    if last > len(gens):
        typer.echo(f"note: --generations {last}: {store} has {count(len(gens), 'generation')}; training on all",
                   err=True)
    return st.keys("train", gens) + st.keys("holdout", gens)


_PRINTED = {"pass", "stage", "nnz", "density", "seconds", "elapsed", "holdout"}
_REFIT_SUMMARY = ("l1", "l1_rule", "select", "l2", "adaptive", "kkt", "loss", "iterations", "evaluations", "objective",
                  "grad_norm", "converged", "seconds", "holdout_before", "nnz_before")


def _figure(v) -> str:
    """A per-pass figure as a person reads it: counts with thousands separators, the rest to 4 digits."""
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 1e15):
        return f"{int(v):,}"
    return f"{v:.4g}"


def refit_options(on: bool, l2: float | None, iters: int | None, l1: str | None = None,
                  kkt: int | None = None, relax: bool = False, adaptive: bool = True, select: str | None = None,
                  l1_flag: str = "--refit-l1", select_flag: str = "--refit-select",
                  kkt_flag: str = "--refit-kkt", relax_flag: str = "--refit-relax",
                  adaptive_flag: str = "--no-refit-adaptive") -> dict | None:
    """The keywords of :func:`pipeline.refit.refit` from the refit flags (train's ``--refit-*`` or `sparsepipe
    refit`'s); None without ``on``. A flag without ``on`` or a bad L1 value is a usage error (exit 2)."""
    if not on:
        if (l2 is not None or iters is not None or l1 is not None or kkt is not None or relax or not adaptive
                or select is not None):
            fail("--refit-l1, --refit-l2, --refit-iters, --refit-kkt, --refit-relax, --no-refit-adaptive and "
                 "--refit-select need --refit (on by default for stsgd only)", 2)
        return None
    if l1 is not None:
        from pipeline.refit import parse_l1

        try:
            l1 = parse_l1(l1)
        except ValueError as e:
            fail(f"{l1_flag}: {e}", 2)
        if l1 == 0 and kkt is not None:
            fail(f"{kkt_flag} needs an L1 penalty ({l1_flag} auto or a number > 0): the KKT conditions it checks are "
                 f"the L1 problem's", 2)
        path_flags = [f for f, given in ((select_flag, select is not None), (relax_flag, relax),
                                         (adaptive_flag, not adaptive)) if given]
        if l1 != "auto" and path_flags:
            fail(f"{', '.join(path_flags)} set(s) the validated L1 path, which only {l1_flag} auto runs "
                 f"({l1_flag} {l1:g} fits that one penalty)", 2)
    if select is not None:
        from pipeline.refit import parse_select

        try:
            parse_select(select)
        except ValueError as e:
            fail(f"{select_flag}: {e}", 2)
    return {k: v for k, v in (("l2", l2), ("max_iter", iters), ("l1", l1), ("kkt_rounds", kkt),
                              ("relax", relax or None), ("adaptive", None if adaptive else False), ("select", select))
            if v is not None}


def _write_record(path: Path, history: list) -> None:
    from pipeline.atomic import write_atomically

    lines = [json_line({"stage": h["stage"], "pass": h["pass"], "density": h.get("density"), "nnz": h.get("nnz"),
                        **{f"holdout_{k}": v for k, v in (h.get("holdout") or {}).items()}}) + "\n"
             for h in history if "stopped" not in h]
    write_atomically(path, lambda f: f.write("".join(lines).encode()), durable=False)


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
    from pipeline.store.reader import SPLITS

    check_choice(split, SPLITS, "--split")
    try:
        m = load_model(model, state=False)
        if workers or scheduler:
            with dask_client(workers, scheduler) as client:
                res = evaluate_store(m, str(store), split, client)
        else:
            res = evaluate_store(m, str(store), split)
    except user_errors() as e:
        fail(str(e))
    res["model"] = str(model)
    kinds = (m.meta.get("label_kind"), "regression" if "rmse" in res else "binary")  # the store's, by its metrics
    if None not in kinds and kinds[0] != kinds[1]:
        typer.echo(f"note: {model} was trained on {kinds[0]} labels and {store}'s are {kinds[1]}: these are "
                   f"{kinds[1]} metrics of a {kinds[0]} model", err=True)
    if res.get("nnz_beyond_store"):
        typer.echo(f"note: {model} is {m.n_features:,} features wide and {store} {res['n_features_store']:,}: its "
                   f"{res['nnz_beyond_store']:,} non-zeros past the store's width score nothing here", err=True)
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
    out: Path = typer.Option(..., "--out", "-o", help="Output: one line per row, 'label score': the score is the "
                             "margin w·x + b (not a probability: a logistic model's is 1/(1 + e^-score)) and the "
                             "label its sign as +1/-1, whatever the input's encoding; a regression model writes "
                             "its prediction in both columns (the first to 6 digits)."),
    zero_based: bool = typer.Option(False, "--zero-based", help="LIBSVM input indices start at 0."),
    no_verify: bool = no_verify_option(remote=False),
):
    """Scores and predicted labels for every row of INPUT (text is read in float64, a store in its dtype, so the
    two can differ in the 8th digit for a float32 store)."""
    apply_verify(no_verify)
    check_output(out, "predictions")
    from pipeline.model import load_model
    from pipeline.predict import predict_to_file

    try:
        n = predict_to_file(load_model(model, state=False), str(input), str(out), zero_based=zero_based)
    except user_errors() as e:
        fail(str(e))
    typer.echo(f"{out}: {n:,} predictions")
