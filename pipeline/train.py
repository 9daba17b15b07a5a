"""Training entry point: algorithm + store -> engine -> Model with provenance and holdout metrics."""
from __future__ import annotations

import os
import time

import numpy as np

from pipeline.algorithms import DEFAULT_ALGO, make_algorithm
from pipeline.model import Model, load_model
from pipeline.store.order import STORE_IDS, model_external, model_internal
from pipeline.store.readlock import reads_store


def _with_squared_loss() -> list[str]:
    """The algorithms whose hyper-parameters accept ``loss = "squared"`` (regression)."""
    from pipeline.algorithms import ALGORITHMS, params_class

    def accepts(name):
        try:
            params_class(name)(loss="squared")
        except (TypeError, ValueError):
            return False
        return True

    return [name for name in ALGORITHMS if accepts(name)]


PASSES_REFITTED, PASSES_OWN = 3, 5


def default_passes(refits: bool) -> int:
    """Passes when none are given: 3 when the model is refitted, where the learner only chooses the support, else 5,
    where its own weights are the model. Measured (docs/results.md, "How many passes by default"): stsgd + refit at
    350k rows 5.84% with 3 passes against 5.92% with 5, at 35k rows 8.76% against 9.99%; without a refit more
    passes help (tg at 350k rows 12.04% -> 11.01%; the stsgd learner alone on 11 of 12 shared (set, loss) pairs)."""
    return PASSES_REFITTED if refits else PASSES_OWN


@reads_store("store_path")
def fit(store_path: str, algo: str = DEFAULT_ALGO, options: dict | None = None, *, passes: int | None = None,
        paths: int = 1, seed: int = 0, client=None, init_model: Model | None = None, placement: str = "paths",
        stage_blocks: int = 0, evaluate: bool = True, max_density: float | None = None,
        evaluate_every: int = 1, shuffle_window: int = 4, progress=None, blocks=None,
        refit: dict | None = None) -> Model:
    """Train and return the aggregated sparse model (optimiser state included for warm start/resume).
    ``passes`` None: :func:`default_passes`.

    With ``init_model`` of the same algorithm, hyper-parameters and number of paths, training resumes
    exactly where it stopped ("2 passes + 3 passes" equals "5 passes"); otherwise its weights warm-start
    every path. A model whose own stopping rule ended its training (``meta["stopped"] == "rule"``: STSGD's
    tolerance, two-stage's epochs) is final: it too only warm-starts a new run (``provenance["after_stop"]``).
    ``blocks`` (block keys, e.g. :func:`pipeline.store.reader.Store.window`) restricts training to those blocks;
    None: all training blocks.
    ``refit`` (a dict of :func:`pipeline.refit.refit` keywords: l2, max_iter, loss, tol; ``{}`` for the
    defaults) refits the selected support with an L2 penalty; the holdout metrics are then the refitted
    model's (the sparse model's are kept in ``meta['refit']['holdout_before']``). ``init_model`` may be a path.
    The run settings are checked as `train` checks them (ValueError naming the setting).
    """
    from pipeline.config import check_settings
    from pipeline.engine import train

    passes = default_passes(refit is not None) if passes is None else passes
    run = {"passes": passes, "paths": paths, "seed": seed, "placement": placement, "stage_blocks": stage_blocks,
           "evaluate_every": evaluate_every, "shuffle_window": shuffle_window}
    check_settings({**run, **({"max_density": max_density} if max_density is not None else {})}, algo, "fit")
    if isinstance(init_model, (str, os.PathLike)):
        path, init_model = os.fspath(init_model), load_model(init_model)
        init_model.meta["path"] = path
    from pipeline.store.reader import open_store

    from pipeline.store.stats import calibrate

    algorithm = make_algorithm(algo, dict(options or {}))
    st = open_store(store_path)
    loss = getattr(algorithm.params, "loss", None)
    if st.label_kind == "regression" and loss in ("logistic", "hinge"):
        squared = _with_squared_loss()
        fix = ("use --loss squared" if algo in squared else
               f"--algo {algo} has no squared loss; use --algo {' or '.join(squared)} with --loss squared")
        raise ValueError(f"{store_path}: its labels are real numbers (regression); --algo {algo} with {loss} loss "
                         f"needs binary labels: {fix}")
    calibrate(algorithm, st)  # before the resume check: resolved values are part of hyper()
    init_states = init_gstate = warm = None
    resumed = after_stop = False
    order = (st.feature_order or {}).get("digest")
    if order:
        st.order_maps  # read (and checked) before training, not when the model is saved
    if init_model is not None:
        same = (init_model.algorithm == algo and _same_hyper(init_model.meta.get("hyper"), algorithm)
                and init_model.states is not None and len(init_model.states) == paths
                and init_model.meta.get("seed") == seed
                and init_model.meta.get("shuffle_window", 4) == shuffle_window
                and init_model.meta.get("feature_order") == order)  # the state's ids are the store's
        after_stop = same and init_model.gstate is not None and algorithm.finished(init_model.gstate)
        same = same and not after_stop
        if same:
            init_states, init_gstate, resumed = init_model.states, init_model.gstate, True
        else:
            warm = model_internal(init_model, st).warm_weights()  # a refitted model's: its sparse learner's
    t0 = time.time()
    res = train(st.path, algorithm, passes=passes, paths=paths, seed=seed, client=client,
                init_states=init_states, init_gstate=init_gstate, warm=warm, placement=placement,
                stage_blocks=stage_blocks, evaluate=evaluate, evaluate_every=evaluate_every,
                max_density=max_density, shuffle_window=shuffle_window, progress=progress, blocks=blocks)
    total_passes = int(min(s["cursor"][0] for s in res.states))
    last = next((h for h in reversed(res.history) if h.get("holdout")), {})
    meta = {
        "algorithm": algo, "hyper": _jsonable(algorithm.hyper()), "shared_keys": list(algorithm.shared_keys),
        "seed": seed, "paths": paths, "passes": total_passes, "label_kind": st.label_kind,
        "max_density": max_density, "shuffle_window": shuffle_window,
        "stopped": ("diverged" if algorithm.diverged(res.gstate) or not np.all(np.isfinite(res.w))
                    or not np.isfinite(res.bias) else None)
        or next((h["stopped"] for h in res.history if "stopped" in h), None)
        or ("rule" if algorithm.finished(res.gstate) else None),
        "provenance": {"store": st.path, "store_id": st.manifest["store_id"],
                       "manifest_version": st.manifest["manifest_version"], "n_rows": st.n_rows,
                       "blocks": sorted(blocks) if blocks is not None else None,
                       "init_model": init_model.meta.get("path") if init_model is not None else None,
                       "resumed": resumed, "after_stop": after_stop,
                       "warm_from": None if warm is None else "learner" if init_model.learner is not None else "model",
                       "seconds": round(time.time() - t0, 3), "timing": res.timing,
                       "trained_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "history": _jsonable(res.history),
        "holdout": _jsonable(last.get("holdout")),
        **({"feature_order": order, STORE_IDS: order} if order else {}),  # the state's ids; the weights' until saved
    }
    model = Model.from_dense(res.w, res.bias, meta=meta, states=res.states, gstate=res.gstate)
    if refit is not None:
        model = refit_model(model, st, client, blocks, evaluate, refit)
    return model_external(model, st)


def refit_model(model: Model, st, client=None, blocks=None, evaluate: bool = True, options: dict | None = None) -> Model:
    """The relaxed-lasso refit of ``model`` on its support (pipeline/refit.py), with its holdout metrics."""
    from pipeline.evaluate import evaluate_store
    from pipeline.refit import refit

    model = refit(model, st.path, client=client, blocks=blocks, **(options or {}))
    if evaluate and st.entries("holdout", blocks):
        res = evaluate_store(model, st.path, "holdout", client, blocks=blocks)
        model.meta["holdout"] = _jsonable({k: v for k, v in res.items()
                                           if k not in ("split", "store", "blocks", "nnz", "density", "n_features")})
    model.meta["refit"] = _jsonable(model.meta["refit"])
    return model


def _same_hyper(saved: dict | None, algorithm) -> bool:
    """A saved model's hyper-parameters are the algorithm's. A parameter the model lacks (added since it was
    saved) counts as the same when the algorithm runs it at its default, so such a model still resumes."""
    import dataclasses

    cur = _jsonable(algorithm.hyper())
    if not isinstance(saved, dict) or not set(saved) <= set(cur):
        return False
    old = {**_jsonable(dataclasses.asdict(type(algorithm.params)())), **saved}  # the defaults, then what was saved
    return {k: old[k] for k in cur if k in old} == cur


def _jsonable(x):
    import json
    import math

    def fix(o):
        if isinstance(o, dict):
            return {k: fix(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [fix(v) for v in o]
        if hasattr(o, "item"):
            o = o.item()
        if isinstance(o, float) and not math.isfinite(o):
            return repr(o) if not math.isnan(o) else None
        return o

    return json.loads(json.dumps(fix(x)))
