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
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import typer

from cli.app import apply_verify, check_choice, fail
from pipeline.algorithms import ALGORITHMS, DEFAULT_ALGO  # the registry only (the algorithms' modules load when used)

from pipeline.config import RUN_CHOICES, RUN_KEYS, RUN_MIN, RUN_TYPES, WANT, check_settings, type_ok  # noqa: F401

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
    Opt("passes", Optional[int], "Passes over the training blocks (default: 3 when the model is refitted, as stsgd's "
        "is by default: the learner only chooses the support; else 5).", kind="run", min=1),
    Opt("eta", Optional[float], "Learning rate; with scale \"data\" (stsgd's and tg's default) in units of "
                                 "1/E||x||^2, the store's mean squared row norm.", min=0.0),
    Opt("schedule", Optional[str], "constant | sqrt (eta/sqrt(t)) | invscaling (eta/t^power_t; sgd, tg, l1proj, "
                                   "fobos)."),
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
    Opt("stage_blocks", Optional[int], "Multi-path algorithms: blocks per path per stage, rounded up to whole "
        "shuffle windows (0 = the algorithm's own stage length).", kind="run", min=0),
    Opt("generations", Optional[int], "Train on the blocks of the newest N generations (ingests/appends) only "
        "(0 = all, the default); the holdout is then their holdout blocks.", kind="run", min=0),
    Opt("no_informative", bool, "STSGD: truncation = touched (only the burst's touched coordinates, by g0·K) "
        "instead of the default uniform; the paper's informative truncation is --set truncation=informative.",
        default=False, flags=("--no-informative",), kind="switch"),
    Opt("no_stability", bool, "STSGD ablation: no purging.", default=False, flags=("--no-stability",),
        kind="switch"),
    Opt("fixed_gravity", Optional[float], "STSGD ablation: constant base gravity g0 (no adaptive gravity, no "
        "annealing).", min=0.0),
    Opt("settings", Optional[List[str]], "Any hyper-parameter of the algorithm as KEY=VALUE (repeatable), e.g. "
        "--set pi0=0.8; `sparsepipe algorithms NAME` lists them.", flags=("--set",), kind="special"),
    Opt("config", Optional[Path], "TOML file of training settings: algo, the algorithm's hyper-parameters and "
        "the run settings (passes, paths, workers, seed, ...), flat or in one \\[train] table; unknown keys and "
        "tables are refused. The command line overrides it.",
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
        if cfg:
            check_config(cfg, name, cfg_path)
        cli = {}
        for o in OPTIONS:
            val = v.get(o.name)
            if o.kind in ("hyper", "run") and val is not None:
                cli[o.name] = val
        for flag in [k for k in HYPER_FLAGS if k in cli]:
            if flag not in hyper_types:
                fail(_not_for(flag, name), 2)
            if not type_ok(cli[flag], hyper_types[flag]):  # a key of the same name and another meaning
                given = type(cli[flag])
                fail(f"--{flag.replace('_', '-')} takes {WANT.get(given, 'a value')}, the '{flag}' of "
                     f"{', '.join(_typed(flag, given))}; --algo {name}'s '{flag}' is "
                     f"{WANT.get(hyper_types[flag], 'a value')}: use --set {flag}=VALUE (`sparsepipe algorithms "
                     f"{name}` lists it)", 2)
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
        for key, choices in RUN_CHOICES.items():
            if key in run:
                check_choice(run[key], choices, f"--{key}")
        try:  # the algorithm's own checks (K >= 1, a known loss, an option it would not read ...) before any work
            from pipeline.algorithms import params_class, params_from_dict

            params_from_dict(params_class(name), opts, where=f"--algo {name}")
        except ValueError as e:  # named "--algo NAME: ..." by params_from_dict
            fail(str(e), 2)
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


def _typed(key: str, typ) -> list:
    """The algorithms whose hyper-parameter ``key`` has type ``typ``."""
    return [a for a in _having(key) if _hyper_types(a).get(key) is typ]


def _hyper_types(name: str) -> dict:
    from pipeline.algorithms import ALGORITHMS
    from pipeline.algorithms.describe import param_types

    if name not in ALGORITHMS:
        fail(f"unknown algorithm {name!r}; choose one of {', '.join(sorted(ALGORITHMS))} "
             f"(`sparsepipe algorithms` describes them)", 2)
    return param_types(name)


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
        fail(f"{path}: invalid TOML ({e})", 2)
    if isinstance(cfg.get("train"), dict):
        rest = sorted(k for k in cfg if k != "train")
        if rest:
            fail(f"{path}: {', '.join(rest)} outside the [train] table; a config is flat or one [train] table", 2)
        cfg = cfg["train"]
    tables = sorted(k for k, v in cfg.items() if isinstance(v, dict))
    if tables:
        fail(f"{path}: unknown table(s) {', '.join(tables)}; a config is flat or one [train] table of "
             f"`train` options", 2)
    return {k.replace("-", "_"): v for k, v in cfg.items()}


def check_config(cfg: dict, name: str, path) -> None:
    """Every key known (run settings or the algorithm's hyper-parameters), of the right type and accepted by the
    algorithm's checks (exit 2 naming the file and the key)."""
    try:
        check_settings(cfg, name, str(path))
    except ValueError as e:
        fail(str(e), 2)


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
