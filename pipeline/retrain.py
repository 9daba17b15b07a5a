"""The nightly retraining job: lock, append, validate, train (warm start / exact resume), evaluate candidate
and production on the same data, promote or reject through a gate, retention. Safe to re-run and to kill.

A run is identified by its new inputs (a hash of their fingerprints; without new inputs, by the store
version and the training settings). Its directory ``REG/runs/<run>/`` holds ``state.json`` (what is done:
appended generation, validation, passes checkpointed, metrics and decision, registered version) and
``checkpoint.npz`` (the model with its optimiser state after every completed pass). Every step is
idempotent, so a re-run after a kill continues where the killed one stopped and ends as an uninterrupted run
would (bit-identical weights: the passes are resumed exactly from the checkpoint). A completed run re-run is
a no-op that reports its decision.

Fault points (for tests and drills): ``SPARSEPIPE_FAULT=NAME[:N][,NAME2...]`` kills the process with
SIGKILL at the N-th time (default first) it reaches point NAME; see :data:`FAULT_POINTS`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import signal
import time
import tomllib
from dataclasses import dataclass, field

import numpy as np

from pipeline.algorithms import DEFAULT_ALGO
from pipeline import interrupt
from pipeline.config import RUN_MIN, RUN_TYPES, WANT, check_settings, type_ok
from pipeline.registry import LockedError, RegistryError, open_registry

FAULT_ENV = "SPARSEPIPE_FAULT"
FAULT_POINTS = {
    "during_append": "an append has written blocks, the manifest is not replaced yet",
    "after_append": "the new inputs are committed to the store, nothing validated",
    "after_validate": "the new generation is validated, nothing trained",
    "during_train": "a pass/stage of training finished, its checkpoint not yet written",
    "after_checkpoint": "a pass's checkpoint is written (N: the N-th pass of this process)",
    "during_refit": "the [refit] step evaluated its objective (N: the N-th time), the refitted model not yet made",
    "after_train": "the candidate is trained (and refitted with [refit]), not evaluated",
    "after_evaluate": "metrics and decision recorded, nothing registered",
    "during_promote": "the candidate's model file is in the registry, the index does not list it yet",
    "after_register": "the candidate is listed in the index, the production pointer not moved",
    "during_retention": "the index no longer lists deleted versions, their files still exist",
    "before_done": "everything done except marking the run complete",
}
_HITS: dict = {}

EXIT_OK, EXIT_ERROR, EXIT_LOCKED, EXIT_REFUSED = 0, 1, 3, 4
# [train] keys that are run settings (hyper-parameters are the algorithm's): `train --config`'s, less those the job
# sets itself (its window; one evaluation a night, recorded in the registry); workers = 0 trains in this process
NOT_IN_JOB = {"generations": "the training window is the job's [window] generations",
              "record_path": "the job evaluates once a night, after training; REG/runs.jsonl and the index record it",
              "evaluate_every": "the job evaluates once a night, after training"}
TRAIN_RUN_TYPES = {k: t for k, t in RUN_TYPES.items() if k not in NOT_IN_JOB}
TRAIN_RUN_KEYS = set(TRAIN_RUN_TYPES)
TRAIN_RUN_MIN = {**RUN_MIN, "workers": 0}
METRICS = {"error": False, "auc": True, "logloss": False, "rmse": False}  # name -> higher is better


def fault(name: str) -> None:
    """Kill this process (SIGKILL, no clean-up) when ``$SPARSEPIPE_FAULT`` names this point; stop here if an
    interrupt was received and lost (:func:`pipeline.interrupt.check`)."""
    interrupt.check()
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    for item in spec.split(","):
        point, _, nth = item.strip().partition(":")
        if point == name:
            _HITS[name] = _HITS.get(name, 0) + 1
            if _HITS[name] == int(nth or 1):
                os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------------------------- config

@dataclass
class Gate:
    metric: str = "error"
    max_change: float = 0.0
    max_density: float | None = None
    min_auc: float | None = None
    max_error: float | None = None


@dataclass
class Validation:
    min_rows: int = 1                 # fewer rows in the new generation: refused (an empty night)
    max_label_shift: float = 0.1      # positive fraction outside the history's [min, max] by more: refused
    max_nnz_ratio: float = 2.0        # mean non-zeros per row outside [min / r, max * r] of history: refused
    max_unseen_share: float = 0.5     # share of the new non-zeros on features history never had: refused

    def __post_init__(self):
        for name, lo, hi in (("min_rows", 0, math.inf), ("max_label_shift", 0, 1), ("max_nnz_ratio", 1, math.inf),
                             ("max_unseen_share", 0, 1)):
            v = getattr(self, name)
            if not lo <= v <= hi:
                raise ValueError(f"{name} must be in [{lo}, {hi}], got {v!r}")


@dataclass
class JobConfig:
    store: str
    registry: str
    train: dict = field(default_factory=dict)
    gate: Gate = field(default_factory=Gate)
    generations: int = 0
    keep: int = 10
    validation: Validation = field(default_factory=Validation)
    ingest: dict = field(default_factory=dict)
    refit: dict = field(default_factory=dict)
    source: str = "<flags>"

    @property
    def algo(self) -> str:
        return self.train.get("algo", DEFAULT_ALGO)

    def hyper(self) -> dict:
        return {k: v for k, v in self.train.items() if k not in TRAIN_RUN_KEYS}

    @property
    def refits(self) -> bool:
        """Whether the job refits its candidate: ``[refit] enabled``, by default `train`'s rule for the algorithm."""
        from pipeline.refit import refit_by_default

        return bool(self.refit.get("enabled", refit_by_default(self.algo)))

    def refit_options(self) -> dict:
        """``[refit]``'s keywords for :func:`pipeline.refit.refit`."""
        return {k: v for k, v in self.refit.items() if k != "enabled"}


SECTIONS = {"train", "gate", "window", "retention", "validation", "ingest", "refit"}
REFIT_KEYS = {"enabled": bool, "l1": (str, int, float), "l2": (int, float), "max_iter": int, "relax": bool,
              "adaptive": bool, "select": str}
TOP_KEYS = {"store", "registry"}


def load_job(path=None, overrides: dict | None = None) -> JobConfig:
    """JOB.toml (plus ``overrides``: {"store": .., "train": {..}, "gate": {..}, ...}) -> JobConfig.

    Unknown keys, and [train] values of the wrong type or refused by the algorithm, raise ValueError naming the
    file and the key (or the command line's flags, when the file alone is valid): before the job appends anything."""
    raw: dict = {}
    src = str(path) if path else "the command line"
    flags = {k: v for k, v in (overrides or {}).items() if k not in TOP_KEYS and v not in (None, {})}
    if path is not None and flags:  # the file alone first: an error after that is the flags'
        load_job(path, {k: v for k, v in overrides.items() if k in TOP_KEYS})
        src = f"the command line's settings (with {path})"
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise ValueError(f"{path}: no such job file") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: invalid TOML ({e})") from None
    raw = {k.replace("-", "_"): ({kk.replace("-", "_"): vv for kk, vv in v.items()} if isinstance(v, dict) else v)
           for k, v in raw.items()}
    for k, v in (overrides or {}).items():
        if isinstance(v, dict):
            raw.setdefault(k, {}).update(v)
        elif v is not None:
            raw[k] = v
    for k, v in raw.items():
        if k in SECTIONS:
            if not isinstance(v, dict):
                raise ValueError(f"{src}: [{k}] must be a table")
        elif k not in TOP_KEYS:
            raise ValueError(f"{src}: unknown key {k!r}; known: {', '.join(sorted(TOP_KEYS | SECTIONS))}")
    for k in ("store", "registry"):
        if not raw.get(k):
            raise ValueError(f"{src}: missing key {k!r}")

    def table(name, allowed):
        t = dict(raw.get(name, {}))
        bad = sorted(set(t) - set(allowed))
        if bad:
            raise ValueError(f"{src}: unknown key {', '.join(f'{name}.{b}' for b in bad)}; known in [{name}]: "
                             f"{', '.join(sorted(allowed))}")
        return t

    def typed(name, cls):
        """The table ``name`` as the dataclass ``cls``: known keys of its fields' types, and its own checks."""
        t = table(name, {f.name for f in dataclasses.fields(cls)})
        for f in dataclasses.fields(cls):
            typ = {"float": float, "int": int, "bool": bool, "str": str}.get(str(f.type).split(" ")[0], object)
            if f.name in t and not type_ok(t[f.name], typ):
                raise ValueError(f"{src}: {name}.{f.name} must be {WANT.get(typ, 'a value')}, got {t[f.name]!r}")
        try:
            return cls(**t)
        except ValueError as e:
            raise ValueError(f"{src}: [{name}] {e}") from None

    tr = dict(raw.get("train", {}))
    for k in sorted(set(tr) & set(NOT_IN_JOB)):
        raise ValueError(f"{src}: train.{k}: {NOT_IN_JOB[k]}")
    check_settings(tr, tr.get("algo", DEFAULT_ALGO), src, TRAIN_RUN_TYPES, TRAIN_RUN_MIN, prefix="train.")
    gate = typed("gate", Gate)
    if gate.metric not in METRICS:
        raise ValueError(f"{src}: gate.metric must be one of {', '.join(METRICS)}, got {gate.metric!r}")
    win = table("window", {"generations"})
    ret = table("retention", {"keep"})
    for key, v in (("window.generations", win.get("generations", 0)), ("retention.keep", ret.get("keep", 10))):
        if not type_ok(v, int):
            raise ValueError(f"{src}: {key} must be an integer, got {v!r}")
    val = typed("validation", Validation)
    from pipeline.ingest import IngestOptions
    from pipeline.refit import SELECT_RULES

    ing = dataclasses.asdict(typed("ingest", IngestOptions))
    ing = {k: v for k, v in ing.items() if k in raw.get("ingest", {})}
    ref = table("refit", set(REFIT_KEYS))
    for k, v in ref.items():
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not isinstance(v, REFIT_KEYS[k]) or (k == "l1" and isinstance(v, str) and v != "auto") \
                or (k == "select" and v not in SELECT_RULES) or (REFIT_KEYS[k] is not bool and isinstance(v, bool)) \
                or (k in ("l1", "l2") and number and not 0 <= v < math.inf) or (k == "max_iter" and number and v < 1):
            raise ValueError(f"{src}: refit.{k} has the wrong type or value: {v!r}"
                             + (f" (one of {', '.join(SELECT_RULES)})" if k == "select" else ""))
    cfg = JobConfig(store=str(raw["store"]), registry=str(raw["registry"]), train=tr, gate=gate,
                    generations=int(win.get("generations", 0)), keep=int(ret.get("keep", 10)), validation=val,
                    ingest=ing, refit=ref, source=src)
    if cfg.generations < 0:
        raise ValueError(f"{src}: window.generations must be >= 0")
    if cfg.keep < 1:
        raise ValueError(f"{src}: retention.keep must be >= 1")
    return cfg


# ---------------------------------------------------------------------------------------------- helpers

class JobError(Exception):
    pass


class _Clients:
    """Dask clients started on first use: training in this process when workers = 0 (the append then runs
    on a small in-process threaded cluster), else an embedded LocalCluster or an existing scheduler."""

    def __init__(self, train: dict, client=None):
        self.workers = train.get("workers")
        self.scheduler = train.get("scheduler")
        self.given = client
        self.stack = contextlib.ExitStack()
        self.c = None

    def ingest_client(self):
        if self.given is not None:
            return self.given
        if self.c is None:  # workers 0: this process's threads (no Dask scheduler, so no listening socket)
            from pipeline.cluster import dask_client

            self.c = self.stack.enter_context(dask_client(self.workers, self.scheduler))
        return self.c

    def train_client(self):
        if self.given is not None:
            return self.given
        if self.workers == 0 and not self.scheduler:
            return None
        return self.ingest_client()

    def close(self):
        self.stack.close()


def _run_key(fingerprints: list[str], cfg: JobConfig, st) -> str:
    if fingerprints:
        return "night-" + hashlib.sha256("\n".join(sorted(fingerprints)).encode()).hexdigest()[:16]
    desc = json.dumps({"store": st.manifest["store_id"], "version": st.manifest["manifest_version"],
                       "train": cfg.train, "window": cfg.generations, **({"refit": cfg.refit} if cfg.refit else {})},
                      sort_keys=True, default=str)
    return "manual-" + hashlib.sha256(desc.encode()).hexdigest()[:16]


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _metrics(res: dict) -> dict:
    keep = ("n_rows", "error", "auc", "logloss", "hinge", "rmse", "mae", "nnz", "density", "n_features")
    return {k: _finite(res[k]) for k in keep if k in res}


# ---------------------------------------------------------------------------------------------- validation

def validate_generation(st, generation: int, exclude=(), thresholds: Validation | None = None) -> dict:
    """Compare generation ``generation`` with the earlier ones (less ``exclude``): rows, label balance,
    non-zeros per row, share of non-zeros on unseen features. Returns {ok, reasons, checks}."""
    th = thresholds or Validation()
    blocks = st.manifest["blocks"]
    gen_of = lambda e: int(e.get("generation", 1))  # noqa: E731
    new = [e for e in blocks if gen_of(e) == generation]
    hist_gens = sorted({gen_of(e) for e in blocks if gen_of(e) < generation and gen_of(e) not in set(exclude)})
    rows = int(sum(e["rows"] for e in new))
    checks: dict = {"rows": rows, "history_generations": hist_gens}
    reasons = []
    if rows < th.min_rows:
        reasons.append(f"generation {generation} has {rows} rows (< min_rows {th.min_rows})")
        return {"ok": False, "reasons": reasons, "checks": checks, "generation": generation}
    if not hist_gens:
        return {"ok": True, "reasons": [], "checks": checks, "generation": generation}
    per_gen = {}
    for g in hist_gens + [generation]:
        es = [e for e in blocks if gen_of(e) == g]
        r = sum(e["rows"] for e in es)
        pos = 0
        if st.label_kind != "regression":
            pos = sum(int(np.sum(st.block(e).y > 0)) for e in es)
        per_gen[g] = {"rows": r, "positive_fraction": pos / r if r else 0.0,
                      "nnz_per_row": sum(e["nnz"] for e in es) / r if r else 0.0}
    hist = [per_gen[g] for g in hist_gens if per_gen[g]["rows"]]
    cur = per_gen[generation]
    if st.label_kind != "regression" and hist:
        lo, hi = min(h["positive_fraction"] for h in hist), max(h["positive_fraction"] for h in hist)
        checks["positive_fraction"] = {"new": cur["positive_fraction"], "history": [lo, hi]}
        if not (lo - th.max_label_shift <= cur["positive_fraction"] <= hi + th.max_label_shift):
            reasons.append(f"positive fraction {cur['positive_fraction']:.3f} outside the history's "
                           f"[{lo:.3f}, {hi:.3f}] +- max_label_shift {th.max_label_shift}")
    if hist:
        lo, hi = min(h["nnz_per_row"] for h in hist), max(h["nnz_per_row"] for h in hist)
        checks["nnz_per_row"] = {"new": cur["nnz_per_row"], "history": [lo, hi]}
        if not (lo / th.max_nnz_ratio <= cur["nnz_per_row"] <= hi * th.max_nnz_ratio):
            reasons.append(f"non-zeros per row {cur['nnz_per_row']:.1f} outside the history's [{lo:.1f}, {hi:.1f}] "
                           f"by more than a factor max_nnz_ratio {th.max_nnz_ratio}")
    # unseen features: the store's training statistics less the new generation's own training counts
    p = st.n_features
    total = st.feature_stats()["col_nnz"].astype(np.int64)
    new_train = np.zeros(p, dtype=np.int64)
    idx_all = []
    for e in new:
        idx = np.asarray(st.block(e).indices, dtype=np.int64)
        idx_all.append(idx)
        if e["split"] == "train":
            new_train += np.bincount(idx, minlength=p)[:p]
    hist_count = total - new_train
    nnz_new = sum(int(i.shape[0]) for i in idx_all)
    unseen = sum(int(np.count_nonzero(hist_count[i] <= 0)) for i in idx_all)
    share = unseen / nnz_new if nnz_new else 0.0
    checks["unseen_share"] = share
    if share > th.max_unseen_share:
        reasons.append(f"{share:.1%} of the new non-zeros are on features no earlier generation had "
                       f"(> max_unseen_share {th.max_unseen_share:.0%})")
    return {"ok": not reasons, "reasons": reasons, "checks": checks, "generation": generation}


# ---------------------------------------------------------------------------------------------- gate

def _num(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def gate_decision(g: Gate, cand: dict, prod: dict | None) -> tuple[bool, str]:
    """(promote?, reason) for candidate metrics against production's on the same evaluation set."""
    m = g.metric
    c = cand.get(m)
    if c is None or (isinstance(c, float) and not math.isfinite(c)):
        return False, f"candidate has no finite {m} on the evaluation set"
    if g.max_density is not None and cand.get("density", 0.0) > g.max_density:
        return False, f"candidate density {cand['density']:.4g} > max_density {g.max_density}"
    if g.min_auc is not None and not (cand.get("auc") is not None and cand["auc"] >= g.min_auc):
        return False, f"candidate AUC {_num(cand.get('auc'))} < min_auc {g.min_auc}"
    if g.max_error is not None and not (cand.get("error") is not None and cand["error"] <= g.max_error):
        return False, f"candidate error {_num(cand.get('error'))} > max_error {g.max_error}"
    if prod is None:
        return True, f"first model: absolute bounds pass ({m} {c:.4g})"
    p = prod.get(m)
    if p is None:
        return True, f"production has no {m}; absolute bounds pass"
    worse = (p - c) if METRICS[m] else (c - p)
    if worse > g.max_change + 1e-12:
        return False, f"candidate {m} {c:.4g} vs production {p:.4g}: worse by {worse:.4g} > max_change {g.max_change}"
    return True, f"candidate {m} {c:.4g} vs production {p:.4g} (improvement {-worse:+.4g}, max_change {g.max_change})"


# ---------------------------------------------------------------------------------------------- the job

def run_job(cfg: JobConfig, new_inputs: list[str] | None = None, *, force: bool = False, client=None,
            progress=None) -> tuple[int, dict]:
    """Run the nightly job; returns (exit code, result dict). Exit codes: 0 finished (promoted or kept),
    3 another run holds the lock, 4 validation refused the new generation, 1 error (raised as JobError or
    the underlying error by callers that want to)."""
    t_all = time.time()
    new_inputs = [os.fspath(p) for p in (new_inputs or [])]
    say = progress or (lambda step, msg: None)
    steps: dict = {}
    t0 = time.time()
    reg = open_registry(cfg.registry, create=True)
    lock = reg.lock(run="(starting)")
    try:
        lock.__enter__()
    except LockedError as e:
        return EXIT_LOCKED, {"status": "locked", "error": str(e), "exit_code": EXIT_LOCKED}
    clients = _Clients(cfg.train, client)
    try:
        steps["lock"] = round(time.time() - t0, 3)
        say("lock", f"lock taken{' (stale lock taken over)' if lock.stale else ''}")
        return _run_locked(cfg, reg, lock, clients, new_inputs, force, steps, t_all, say)
    except BaseException as e:  # the run log says how the run ended (a kill leaves its "start" alone)
        event = {"event": "interrupted"} if isinstance(e, KeyboardInterrupt) else \
            {"event": "error", "error": f"{type(e).__name__}: {e}"}
        with contextlib.suppress(Exception):
            reg.log({**event, "run": getattr(lock, "run", None)})
        raise
    finally:
        clients.close()
        lock.__exit__(None, None, None)


def _no_holdout(cfg) -> str:
    """Why a night brings no holdout block, and what to change."""
    from pipeline.ingest import IngestOptions

    opts = IngestOptions(**cfg.ingest)
    if opts.holdout <= 0:
        return "ingest with holdout > 0 ([ingest] holdout) so the job has an evaluation set"
    return (f"a night's holdout is a share of its blocks, and a night of one block (a file under [ingest] block_mb = "
            f"{opts.block_mb:g} MB) has none: set a smaller block_mb")


def _holdout_blocks_possible(inputs: list[dict], opts) -> bool:
    """False when appending ``inputs`` (path, size) with ``opts`` surely gives no holdout block: holdout 0, or
    plain files that make one block in all (a compressed file's blocks are known only once it is read)."""
    from pipeline.ingest import compression_of, plan

    if opts.holdout <= 0:
        return False
    sources = [{"path": i["path"], "size": i["size"], "compression": compression_of(i["path"])} for i in inputs]
    if not sum(s["size"] for s in sources):  # empty: the validation says why (min_rows)
        return True
    return any(s["compression"] for s in sources) or len(plan(sources, int(opts.block_mb * (1 << 20)), 1)) >= 2


def _run_locked(cfg, reg, lock, clients, new_inputs, force, steps, t_all, say):
    from pipeline.ingest import IngestOptions, file_size, fingerprint, ingest
    from pipeline.store.reader import open_store

    reg.clean_orphans()
    inputs = []
    for p in new_inputs:
        size = file_size(p)
        inputs.append({"path": p, "size": size, "fingerprint": fingerprint(p, size)})
    st = open_store(cfg.store) if os.path.exists(cfg.store) else None
    if st is None and not inputs:
        raise JobError(f"{cfg.store}: no such store and no --new inputs to create it from")
    run = _run_key([i["fingerprint"] for i in inputs], cfg, st)
    lock.set_run(run)
    state = reg.run_state(run) or {}
    if state.get("status") == "done":
        res = dict(state["result"])
        res.update({"noop": True, "status": "noop", "earlier_status": state["result"].get("status"),
                    "seconds": {"lock": steps["lock"], "total": round(time.time() - t_all, 3)}, "exit_code": EXIT_OK})
        reg.log({"event": "noop", "run": run, "decision": res.get("decision"), "version": res.get("versions")})
        say("done", f"run {run} already completed ({res.get('decision')}); nothing to do")
        return EXIT_OK, res
    reg.log({"event": "start", "run": run, "pid": os.getpid(), "inputs": [i["path"] for i in inputs],
             "resumed": bool(state), "stale_lock": lock.stale, "force": force})
    state.setdefault("run", run)
    state.setdefault("started", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    state["status"] = "running"
    result = {"run": run, "noop": False, "inputs": inputs, "store": cfg.store, "registry": reg.path,
              "resumed": bool(state.get("attempts")), "seconds": steps}
    state["attempts"] = int(state.get("attempts", 0)) + 1
    reg.save_run_state(run, state)

    # (2) append --------------------------------------------------------------------------------
    t0 = time.time()
    generation = None
    if inputs:
        known = {s["fingerprint"]: s for s in (st.manifest["sources"] if st else [])}
        todo = [i["path"] for i in inputs if i["fingerprint"] not in known]
        for i in inputs:
            i["already_appended"] = i["fingerprint"] in known
        if todo:
            opts = IngestOptions(**cfg.ingest)
            new = [i for i in inputs if i["path"] in todo]  # their sizes are read once, above
            if not (st and st.keys("holdout")) and not _holdout_blocks_possible(new, opts):
                raise JobError(f"{cfg.store}: the job would have no evaluation set, and nothing was appended: "
                               f"{_no_holdout(cfg)}")
            say("append", f"appending {len(todo)} input(s) to {cfg.store}")
            summary = ingest(todo, cfg.store, opts, append=st is not None, client=clients.ingest_client(),
                             progress=lambda *a: fault("during_append"))
            fault("after_append")
            for note in summary["notes"]:  # what `ingest` would print (e.g. a store grown past auto's order)
                say("append", f"note: {note}")
            result["append_notes"] = summary["notes"]
        st = open_store(cfg.store)
        known = {s["fingerprint"]: s for s in st.manifest["sources"]}
        for i in inputs:
            i["generation"] = known[i["fingerprint"]]["generation"]
            i["rows"] = known[i["fingerprint"]]["rows"]
        generation = max(i["generation"] for i in inputs)
        result["rows_appended"] = int(sum(i["rows"] for i in inputs))
    else:
        result["rows_appended"] = 0
    result["generation"] = generation
    steps["append"] = round(time.time() - t0, 3)
    store_id = st.manifest["store_id"]

    # (3) validate ------------------------------------------------------------------------------
    t0 = time.time()
    if generation is not None:
        gens = sorted({i["generation"] for i in inputs})
        val = {"ok": True, "reasons": [], "checks": {}, "generations": gens}
        for g in gens:
            v = validate_generation(st, g, exclude=reg.refused(store_id), thresholds=cfg.validation)
            val["checks"][str(g)] = v["checks"]
            val["reasons"] += v["reasons"]
            val["ok"] = val["ok"] and v["ok"]
        val["forced"] = bool(force and not val["ok"])
        for g in gens:
            reg.set_refused(store_id, g, not val["ok"] and not force, run)
        result["validation"] = val
        steps["validate"] = round(time.time() - t0, 3)
        if not val["ok"] and not force:
            result.update({"status": "refused", "decision": "refused", "reason": "; ".join(val["reasons"]),
                           "exit_code": EXIT_REFUSED})
            result["seconds"]["total"] = round(time.time() - t_all, 3)
            state.update({"status": "refused", "validation": val})
            reg.save_run_state(run, state)
            reg.log({"event": "refused", "run": run, "generation": generation, "reasons": val["reasons"]})
            say("validate", "refused: " + "; ".join(val["reasons"]))
            return EXIT_REFUSED, result
        if val["forced"]:
            reg.log({"event": "validation_forced", "run": run, "generation": generation, "reasons": val["reasons"]})
        say("validate", "ok" if val["ok"] else "forced over: " + "; ".join(val["reasons"]))
        fault("after_validate")
    else:
        result["validation"] = None
        steps["validate"] = 0.0

    # window and evaluation set
    excluded = reg.refused(store_id)
    window = st.window(cfg.generations, exclude=excluded)
    train_keys = st.keys("train", window)
    eval_gens = []
    eval_keys = []
    for g in reversed(window):
        eval_keys = st.keys("holdout", [g])
        if eval_keys:
            eval_gens = [g]
            break
    if not train_keys:
        raise JobError(f"{cfg.store}: no training blocks in generations {window}")
    if not eval_keys:
        raise JobError(f"{cfg.store}: no holdout blocks in generations {window}: {_no_holdout(cfg)}")
    result["window"] = {"generations": window, "train_blocks": len(train_keys), "excluded_generations": excluded,
                        "evaluation_generations": eval_gens, "evaluation_blocks": len(eval_keys)}

    # (4) train ---------------------------------------------------------------------------------
    t0 = time.time()
    if "parent" not in state:
        state["parent"] = reg.production_version
        reg.save_run_state(run, state)
    parent = state["parent"]
    production = reg.production() if parent is not None else None
    if production is not None and production.meta.get("registry_version") != parent:
        production = None
    if parent is not None and production is None:
        # the production pointer moved since this run started (a manual promote): load the parent itself
        from pipeline.model import load_model

        production = load_model(reg.model_file(parent))
    candidate, tinfo = _train(cfg, reg, run, st, train_keys, production, clients, say)
    from pipeline.refit import every_few_seconds, refit

    # deterministic: a re-run after a kill refits the checkpoint again, identically
    if cfg.refits:
        line = every_few_seconds(lambda n, s: say("train", f"refit: {n} passes over the support in {s:.0f}s"))

        def progress(n):
            fault("during_refit")
            line(n)

        candidate = refit(candidate, st.path, client=clients.train_client(), blocks=train_keys, progress=progress,
                          **cfg.refit_options())
        r = candidate.meta["refit"]
        tinfo.update(refit={k: r[k] for k in ("l1", "l2", "nnz_before", "nnz", "iterations", "seconds")},
                     nnz=candidate.nnz, density=candidate.density)
        say("train", f"refit: {r['nnz_before']} -> {r['nnz']} non-zeros (l1 {r['l1']:g})")
    state["trained"] = True
    reg.save_run_state(run, state)
    steps["train"] = round(time.time() - t0, 3)
    fault("after_train")

    # (5) evaluate + (6) gate ---------------------------------------------------------------------
    t0 = time.time()
    if "decision" not in state:
        from pipeline.evaluate import evaluate_store

        c = clients.train_client()
        cm = _metrics(evaluate_store(candidate, st.path, "holdout", c, blocks=eval_keys))
        pm = _metrics(evaluate_store(production, st.path, "holdout", c, blocks=eval_keys)) if production else None
        ok, reason = gate_decision(cfg.gate, cm, pm)
        state.update({"candidate_metrics": cm, "production_metrics": pm, "decision": "promote" if ok else "reject",
                      "reason": reason})
        reg.save_run_state(run, state)
    steps["evaluate"] = round(time.time() - t0, 3)
    say("evaluate", f"{state['decision']}: {state['reason']}")
    fault("after_evaluate")

    # register + promote ----------------------------------------------------------------------------
    t0 = time.time()
    rec = reg.find_run(run)
    if rec is None:
        hyper = candidate.meta.get("hyper")
        record = {"version": reg.next_version(), "run": run, "parent": parent, "store_id": store_id,
                  "store": os.path.abspath(st.path), "manifest_version": st.manifest["manifest_version"],
                  "generations": window, "evaluation_generations": eval_gens, "algorithm": candidate.algorithm,
                  "hyper": hyper, "passes": candidate.meta.get("passes"), "paths": candidate.meta.get("paths"),
                  "seed": candidate.meta.get("seed"), "nnz": candidate.nnz, "density": candidate.density,
                  "n_features": candidate.n_features, "metrics": state["candidate_metrics"],
                  "production_metrics": state["production_metrics"],
                  "decision": "promoted" if state["decision"] == "promote" else "rejected",
                  "reason": state["reason"], "warm_start": tinfo["warm_start"]}
        candidate.meta["registry"] = {k: record[k] for k in ("version", "run", "parent", "generations")}
        rec = reg.add_version(candidate, record, fault=fault)
    fault("after_register")
    if state["decision"] == "promote":
        reg.promote(rec["version"], run=run, reason=state["reason"])
    state["version"] = rec["version"]
    reg.save_run_state(run, state)
    steps["promote"] = round(time.time() - t0, 3)
    say("promote", f"version {rec['version']} {'promoted to production' if state['decision'] == 'promote' else 'kept as rejected'}")

    # (7) retention -------------------------------------------------------------------------------
    t0 = time.time()
    deleted = reg.retention(cfg.keep, fault=fault)
    if deleted:
        reg.log({"event": "retention", "run": run, "deleted": deleted, "keep": cfg.keep})
    steps["retention"] = round(time.time() - t0, 3)
    say("retention", f"deleted versions {deleted}" if deleted else "nothing to delete")
    fault("before_done")

    result.update({
        "status": "promoted" if state["decision"] == "promote" else "kept",
        "decision": state["decision"], "reason": state["reason"],
        "candidate": {"version": rec["version"], "metrics": state["candidate_metrics"], **tinfo},
        "production": {"version": parent, "metrics": state["production_metrics"]},
        "versions": {"candidate": rec["version"], "production": reg.production_version,
                     "previous_production": reg.previous_production, "deleted": deleted},
        "exit_code": EXIT_OK,
    })
    steps["total"] = round(time.time() - t_all, 3)
    state.update({"status": "done", "result": result, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    reg.save_run_state(run, state)
    _drop_checkpoint(reg, run)
    reg.log({"event": "end", "run": run, "status": result["status"], "decision": state["decision"],
             "reason": state["reason"], "version": rec["version"], "production": reg.production_version,
             "seconds": steps})
    return EXIT_OK, result


def _drop_checkpoint(reg, run):
    p = os.path.join(reg.runs_dir, run, "checkpoint.npz")
    if os.path.exists(p):
        os.unlink(p)


def _train(cfg: JobConfig, reg, run, st, train_keys, production, clients, say):
    """Train the candidate pass by pass with a checkpoint after each (the run directory's checkpoint.npz);
    resume from it when present. Returns (model, info)."""
    from pipeline.model import ModelError, load_model
    from pipeline.train import default_passes, fit

    tr = cfg.train
    algo = cfg.algo
    passes = int(tr.get("passes", default_passes(cfg.refits)))
    seed = int(tr.get("seed", 0))
    workers = tr.get("workers")
    from pipeline.cluster import default_workers

    n_workers = 1 if workers == 0 else (workers or default_workers())
    paths = tr.get("paths")
    if paths is None and production is not None and production.algorithm == algo and production.meta.get("paths") \
            and production.meta["paths"] <= len(train_keys):
        paths = production.meta["paths"]  # same paths as production: its optimiser state resumes exactly
    from pipeline.algorithms import default_paths

    paths = int(paths or default_paths(algo, n_workers, len(train_keys)))
    ckpt = os.path.join(reg.run_dir(run), "checkpoint.npz")
    done = 0
    model = None
    if os.path.exists(ckpt):
        try:
            model = load_model(ckpt)
            done = int(model.meta.get("retrain", {}).get("passes_done", 0))
            if model.meta.get("stopped"):  # the run's training ended there (as the uninterrupted run's did)
                done = passes
        except ModelError:
            model, done = None, 0  # unreadable: start the run's training again
    warm_from = production.meta.get("registry_version") if production is not None else None
    resumed_first = None
    client = clients.train_client()
    fit_s = ckpt_s = 0.0
    for k in range(done, passes):
        init = model if model is not None else production
        if init is not None:
            init.meta.setdefault("path", ckpt if model is not None else (production.meta.get("path") or ""))
        t0 = time.time()
        try:
            m = fit(st.path, algo, cfg.hyper(), passes=1, paths=paths, seed=seed, client=client, init_model=init,
                    placement=tr.get("placement", "paths"), stage_blocks=int(tr.get("stage_blocks", 0)),
                    evaluate=False, max_density=tr.get("max_density"),
                    shuffle_window=int(tr.get("shuffle_window", 4)), blocks=train_keys,
                    progress=lambda rec: fault("during_train"))
        except ValueError as e:
            if model is not None and "max-density" in str(e):
                break
            raise
        if k == 0:
            resumed_first = bool(m.meta["provenance"]["resumed"])
        m.meta["retrain"] = {"run": run, "passes_done": k + 1, "passes": passes, "parent": warm_from,
                             "resumed_from_parent": resumed_first if k == 0 else
                             (model.meta.get("retrain", {}).get("resumed_from_parent") if model else None)}
        t1 = time.time()
        m.save(ckpt)
        fit_s, ckpt_s = fit_s + (t1 - t0), ckpt_s + (time.time() - t1)
        model = m
        say("train", f"pass {k + 1}/{passes} checkpointed")
        fault("after_checkpoint")
        if m.meta.get("stopped"):  # --max-density, or the algorithm's own stopping rule: the run's model
            break
    if model is None:
        raise JobError("training produced no model")
    info = {"passes": passes, "paths": paths, "nnz": model.nnz, "density": model.density,
            "n_features": model.n_features, "warm_start": warm_from,
            "exact_resume": model.meta.get("retrain", {}).get("resumed_from_parent"),
            "resumed_from_checkpoint_pass": done or None, "fit_seconds": round(fit_s, 3),
            "checkpoint_seconds": round(ckpt_s, 3)}
    return model, info
