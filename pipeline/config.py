"""The training settings a config may hold, and their checks: one definition for `train --config`, `train --set`
and the nightly job's ``[train]`` table (pipeline/retrain.py), so a value that `train` refuses is refused by the
job too, before it touches the store."""
from __future__ import annotations

import math

# Run settings: read by the engine, not by the algorithm.
RUN_TYPES = {"algo": str, "passes": int, "paths": int, "seed": int, "workers": int, "scheduler": str,
             "placement": str, "stage_blocks": int, "max_density": float, "record_path": str,
             "evaluate_every": int, "shuffle_window": int, "generations": int}
RUN_KEYS = set(RUN_TYPES)
RUN_MIN = {"passes": 1, "paths": 1, "workers": 1, "evaluate_every": 1, "shuffle_window": 1, "stage_blocks": 0,
           "generations": 0, "max_density": 0.0}
WANT = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
RUN_CHOICES = {"placement": ("paths", "single")}


class UsageError(ValueError):
    """A setting the user gave that cannot work (the commands exit 2, as for a bad option)."""


def type_ok(val, typ) -> bool:
    if typ is bool:
        return isinstance(val, bool)
    if typ is int:
        return isinstance(val, int) and not isinstance(val, bool)
    if typ is float:
        return isinstance(val, (int, float)) and not isinstance(val, bool)
    if typ is type(None):  # an optional parameter whose default is None: a number or a string
        return isinstance(val, (int, float, str)) and not isinstance(val, bool)
    return isinstance(val, typ)


def check_settings(cfg: dict, algo: str, where: str, run_types: dict | None = None, run_min: dict | None = None,
                   prefix: str = "") -> None:
    """Every key of ``cfg`` a run setting (``run_types``, default :data:`RUN_TYPES`) or a hyper-parameter of
    ``algo``, of the right type and within bounds, and the hyper-parameters accepted by the algorithm's own
    checks (its Params dataclass: ``K = 0`` or ``loss = "foo"`` refused here, not after an hour of work).
    Raises ValueError naming ``where`` and the key (``prefix`` + key, e.g. "train.eta")."""
    from pipeline.algorithms import ALGORITHMS, params_class, params_from_dict
    from pipeline.algorithms.describe import param_types

    run_types = RUN_TYPES if run_types is None else run_types
    run_min = RUN_MIN if run_min is None else run_min
    if not isinstance(algo, str) or algo not in ALGORITHMS:
        raise ValueError(f"{where}: unknown algorithm {algo!r}; choose one of {', '.join(sorted(ALGORITHMS))} "
                         f"(`sparsepipe algorithms` describes them)")
    hyper_types = param_types(algo)
    allowed = set(run_types) | set(hyper_types)
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(prefix + k for k in unknown)} for --algo {algo}; "
                         f"known: {', '.join(sorted(allowed))}")
    for k, val in cfg.items():
        typ = run_types.get(k) or hyper_types.get(k)
        if isinstance(val, float) and math.isnan(val):
            raise ValueError(f"{where}: '{prefix}{k}' is NaN")
        if typ is not None and not type_ok(val, typ):
            raise ValueError(f"{where}: '{prefix}{k}' must be {WANT.get(typ, 'a value')}, got {val!r}")
        lo = run_min.get(k)
        if lo is not None and val < lo:
            raise ValueError(f"{where}: '{prefix}{k}' must be >= {lo}, got {val!r}")
        if k == "max_density" and val > 1:
            raise ValueError(f"{where}: '{prefix}{k}' must be <= 1, got {val!r}")
        if k in RUN_CHOICES and val not in RUN_CHOICES[k]:
            raise ValueError(f"{where}: '{prefix}{k}' must be one of {', '.join(RUN_CHOICES[k])}, got {val!r}")
    hyper = {k: v for k, v in cfg.items() if k not in run_types}
    try:
        params_from_dict(params_class(algo), hyper, where=f"--algo {algo}")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
