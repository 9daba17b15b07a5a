"""The training options, defined once: `train`, `stability` (and `retrain`) take the same set.

Use::

    @app.command()
    @training_options()
    def train(store: Path = typer.Argument(...), ..., training: TrainingOptions = None):
        t = training.resolve()          # algorithm, hyper-parameters, run settings; errors exit cleanly
        t.name, t.hyper, t.run          # 'tg', {'eta': 0.5, ...}, {'passes': 5, 'workers': 2, ...}

:func:`training_options` adds every option of :data:`OPTIONS` to the command's signature (Typer reads it) and
hands them to the command as one :class:`TrainingOptions`. :meth:`TrainingOptions.resolve` merges, in rising
precedence, the ``--config`` TOML file, the command line and ``--set KEY=VALUE``; checks every key and the
type of every value (a config's ``passes = "five"`` is refused naming the file and the key); and refuses a
hyper-parameter flag (``--radius``, ``--nnz``, ``--gravity``, ...) for an algorithm that has no such
parameter, naming the algorithms that do.
"""
from __future__ import annotations

import functools
import inspect
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import typer

from cli.app import apply_verify, fail
from pipeline.algorithms import ALGORITHMS, DEFAULT_ALGO  # the registry only (the algorithms' modules load when used)

# Run settings: read by the engine, not by the algorithm. Types for --config checks.
RUN_TYPES = {"algo": str, "passes": int, "paths": int, "seed": int, "workers": int, "scheduler": str,
             "placement": str, "stage_blocks": int, "max_density": float, "record_path": str,
             "evaluate_every": int, "shuffle_window": int, "generations": int}
RUN_KEYS = set(RUN_TYPES)
RUN_MIN = {"passes": 1, "paths": 1, "workers": 1, "evaluate_every": 1, "shuffle_window": 1, "stage_blocks": 0,
           "generations": 0, "max_density": 0.0}
# ablation switches: CLI flag -> (hyper-parameter, value); only for algorithms that have that parameter
SWITCHES = {"no_informative": ("truncation", "touched"), "no_stability": ("stability", False)}


@dataclass(frozen=True)
class Opt:
    name: str
    annotation: object
    help: str
    default: object = None
    flags: tuple = ()
    kind: str = "hyper"  # hyper: a hyper-parameter of the algorithm | run | switch | special
    min: float | None = None
    max: float | None = None

    def option(self):
        kw = {"help": self.help}
        if self.min is not None:
            kw["min"] = self.min
        if self.max is not None:
            kw["max"] = self.max
        return typer.Option(self.default, *self.flags, **kw)


OPTIONS = [
    Opt("algo", Optional[str], "Algorithm: " + " | ".join(ALGORITHMS) + " (default stsgd). `sparsepipe algorithms "
        "[NAME]` describes each and its hyper-parameters.", kind="run"),
    Opt("loss", Optional[str], "logistic | hinge | squared (the algorithm's default otherwise)."),
    Opt("passes", Optional[int], "Passes over the training blocks (default 5).", kind="run", min=1),
    Opt("eta", Optional[float], "Learning rate.", min=0.0),
    Opt("schedule", Optional[str], "constant | invscaling | sqrt."),
    Opt("power_t", Optional[float], "Exponent of invscaling: eta / t**power_t.", min=0.0),
    Opt("decay", Optional[float], "Per-pass factor on eta (sgd/tg; default 1).", min=0.0, max=1.0),
    Opt("l2", Optional[float], "L2 weight decay (needs theta = inf for tg).", min=0.0),
    Opt("gravity", Optional[float], "TG gravity g (L1 strength), tg only.", min=0.0),
    Opt("K", Optional[int], "TG: truncate every K steps (default 1); STSGD: burst size.", flags=("--K",), min=1),
    Opt("theta", Optional[float], "TG truncation window (default inf).", min=0.0),
    Opt("radius", Optional[float], "l1proj: radius Z of the L1 ball {‖w‖₁ ≤ Z}.", min=0.0),
    Opt("l1_radius", Optional[float], "two-stage: L1 radius B of the Epoch-GD domain.", min=0.0),
    Opt("nnz", Optional[int], "two-stage: target number of non-zeros of the sparsified model.", min=0),
    Opt("epsilon", Optional[float], "two-stage: excess-risk target of the sparsification (TS-9).", min=0.0),
    Opt("sparsify", Optional[str], "two-stage: sparsification method dd | mg."),
    Opt("paths", Optional[int], "Model replicas; sgd/tg split the blocks and average at pass ends "
        "(train: default = workers; stability: 1).", kind="run", min=1),
    Opt("workers", Optional[int], "Local cluster processes (default: threads in this process).", kind="run", min=1),
    Opt("scheduler", Optional[str], "Join an existing Dask scheduler (tcp://host:8786) instead.", kind="run"),
    Opt("seed", Optional[int], "Seed of the block and row orders (default 0).", kind="run"),
    Opt("placement", Optional[str], "paths: one task per path per stage (default); single: the whole loop in "
        "one task (small data).", kind="run"),
    Opt("max_density", Optional[float], "Stop when the model's density (non-zeros / features) reaches this, "
        "inside a pass if need be, and keep the model at that point.", kind="run", min=0.0, max=1.0),
    Opt("evaluate_every", Optional[int], "Evaluate on the holdout every N stages.", kind="run", min=1),
    Opt("shuffle_window", Optional[int], "Shuffle rows across this many consecutive blocks of a path's order "
        "(default 4; guards against label-sorted inputs).", kind="run", min=1),
    Opt("stage_blocks", Optional[int], "Multi-path algorithms: blocks per path per stage (0 = the algorithm's "
        "own stage length).", kind="run", min=0),
    Opt("generations", Optional[int], "Train on the blocks of the newest N generations (ingests/appends) only "
        "(0 = all, the default); the holdout is then their holdout blocks.", kind="run", min=0),
    Opt("no_informative", bool, "STSGD ablation: truncate only the burst's touched coordinates by g0·K.",
        default=False, flags=("--no-informative",), kind="switch"),
    Opt("no_stability", bool, "STSGD ablation: no purging.", default=False, flags=("--no-stability",),
        kind="switch"),
    Opt("fixed_gravity", Optional[float], "STSGD ablation: constant base gravity g0 (no adaptive gravity, no "
        "annealing).", min=0.0),
    Opt("settings", Optional[List[str]], "Any hyper-parameter of the algorithm as KEY=VALUE (repeatable), e.g. "
        "--set pi0=0.8; `sparsepipe algorithms NAME` lists them.", flags=("--set",), kind="special"),
    Opt("config", Optional[Path], "TOML file supplying any of these options (flat, or a [train] table).",
        kind="special"),
    Opt("no_verify", bool, "Read blocks without checking them against the manifest checksums.", default=False,
        flags=("--no-verify",), kind="special"),
]
BY_NAME = {o.name: o for o in OPTIONS}
HYPER_FLAGS = [o.name for o in OPTIONS if o.kind == "hyper"]


@dataclass
class Resolved:
    name: str
    hyper: dict
    run: dict
    config: Path | None = None


@dataclass
class TrainingOptions:
    """The training options as given on the command line (None: not given)."""

    values: dict = field(default_factory=dict)

    def given(self) -> dict:
        return {k: v for k, v in self.values.items() if v is not None and v is not False and v != []}

    def resolve(self, default_algo: str = DEFAULT_ALGO, defaults: dict | None = None) -> Resolved:
        """Merge config < command line < --set; check keys, types and per-algorithm flags (exit 2 with one
        line on a problem). ``defaults``: run settings of the command (e.g. stability's paths = 1)."""
        v = self.values
        apply_verify(bool(v.get("no_verify")))
        cfg_path = v.get("config")
        cfg = read_config(cfg_path)
        name = v.get("algo") or cfg.get("algo") or default_algo
        if not isinstance(name, str):
            fail(f"{cfg_path}: 'algo' must be a string, got {name!r}", 2)
        hyper_types = _hyper_types(name)
        check_config(cfg, hyper_types, cfg_path)
        cli = {}
        for o in OPTIONS:
            val = v.get(o.name)
            if o.kind in ("hyper", "run") and val is not None:
                cli[o.name] = val
        for flag in [k for k in HYPER_FLAGS if k in cli]:
            if flag not in hyper_types:
                fail(_not_for(flag, name), 2)
        for flag, (key, val) in SWITCHES.items():
            if v.get(flag):
                if key not in hyper_types:
                    fail(f"--{flag.replace('_', '-')} applies to algorithms with '{key}' "
                         f"({', '.join(_having(key)) or 'none'}), not {name}", 2)
                cli[key] = val
        opts = {**cfg, **cli}
        try:
            from pipeline.algorithms import parse_setting

            opts.update(dict(parse_setting(name, s) for s in v.get("settings") or []))
        except ValueError as e:
            fail(str(e), 2)
        run = {**(defaults or {}), **{k: opts.pop(k) for k in list(opts) if k in RUN_KEYS}}
        run.pop("algo", None)
        return Resolved(name, opts, run, cfg_path)


def _not_for(flag: str, name: str) -> str:
    having = _having(flag)
    return (f"--{flag.replace('_', '-')} is not a hyper-parameter of --algo {name}"
            + (f"; it applies to {', '.join(having)}" if having else "")
            + f" (`sparsepipe algorithms {name}` lists {name}'s)")


def _having(key: str) -> list:
    from pipeline.algorithms import ALGORITHMS
    from pipeline.algorithms.describe import param_names

    return [a for a in ALGORITHMS if key in param_names(a)]


def _hyper_types(name: str) -> dict:
    from pipeline.algorithms import ALGORITHMS
    from pipeline.algorithms.describe import param_types

    if name not in ALGORITHMS:
        fail(f"unknown algorithm {name!r}; choose one of {', '.join(sorted(ALGORITHMS))} "
             f"(`sparsepipe algorithms` describes them)", 2)
    return param_types(name)


def hyper_names(name: str) -> set:
    return set(_hyper_types(name))


def read_config(path: Path | None) -> dict:
    """Flat TOML (or a [train] table) whose keys are option names (dashes or underscores)."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except FileNotFoundError:
        fail(f"{path}: no such config file")
    except IsADirectoryError:
        fail(f"{path}: is a directory, not a config file")
    except PermissionError:
        fail(f"{path}: cannot read the config file (permission denied)")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        fail(f"{path}: invalid TOML ({e})")
    cfg = cfg.get("train", cfg)
    return {k.replace("-", "_"): v for k, v in cfg.items() if not isinstance(v, dict)}


def _type_ok(val, typ) -> bool:
    if typ is bool:
        return isinstance(val, bool)
    if typ is int:
        return isinstance(val, int) and not isinstance(val, bool)
    if typ is float:
        return isinstance(val, (int, float)) and not isinstance(val, bool)
    if typ is type(None):  # an optional parameter whose default is None: a number or a string
        return isinstance(val, (int, float, str)) and not isinstance(val, bool)
    return isinstance(val, typ)


def check_config(cfg: dict, hyper_types: dict, path) -> None:
    """Every key known (run settings or the algorithm's hyper-parameters) and of the right type (exit 2)."""
    allowed = RUN_KEYS | set(hyper_types)
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        fail(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}", 2)
    for k, val in cfg.items():
        typ = RUN_TYPES.get(k) or hyper_types.get(k)
        if typ is not None and not _type_ok(val, typ):
            want = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(typ, "a value")
            fail(f"{path}: '{k}' must be {want}, got {val!r}", 2)
        lo = RUN_MIN.get(k)
        if lo is not None and val < lo:
            fail(f"{path}: '{k}' must be >= {lo}, got {val!r}", 2)
        if k == "max_density" and val > 1:
            fail(f"{path}: 'max_density' must be <= 1, got {val!r}", 2)
        if isinstance(val, float) and math.isnan(val):
            fail(f"{path}: '{k}' is NaN", 2)


def training_options(exclude: tuple = ()):
    """Decorator: add the shared training options (less ``exclude``) to a Typer command, which receives them
    as ``training: TrainingOptions``."""
    opts = [o for o in OPTIONS if o.name not in exclude]

    def deco(fn):
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != "training"]
        taken = {p.name for p in own}
        extra = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.option(),
                                   annotation=o.annotation) for o in opts if o.name not in taken]

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            values = {p.name: kwargs.pop(p.name) for p in extra}
            return fn(*args, training=TrainingOptions(values), **kwargs)

        wrapper.__signature__ = sig.replace(parameters=own + extra)
        wrapper.__annotations__ = {**{p.name: p.annotation for p in own}, **{p.name: p.annotation for p in extra}}
        del wrapper.__wrapped__
        return wrapper

    return deco
