"""Model registry: numbered model versions, a production pointer, an index and an append-only run log.

A registry is a plain directory, readable with standard tools (JSON and JSON lines, no server)::

    REG/registry.json        {"format": "sparsepipe-registry", "format_version": 1, "production": N | null,
                              "previous": [older production versions, newest last], "refused": [...]}
                             -- the production pointer; replaced atomically (temp file + fsync + os.replace)
    REG/index.jsonl          one JSON object per model version (version, path, created, parent, store id and
                             manifest version, generations, algorithm, hyper-parameters, metrics, decision,
                             reason, run); rewritten atomically when a version is added or removed
    REG/models/v000001.npz   model files (pipeline.model format, no pickle), written atomically
    REG/runs.jsonl           append-only run log (one JSON object per event: start, step, lock takeover,
                             decision, promote, rollback, retention, end)
    REG/runs/<run>/          a retrain run's directory: state.json (steps done), checkpoint.npz
    REG/retrain.lock         the job lock (flock; holds the holder's pid, host and run)

Crash safety: every file is written to a temporary name, fsynced and renamed; the order of a
registration is model file -> index -> pointer, so a kill leaves at worst an unlisted model file, which
:meth:`Registry.clean_orphans` removes. Only ``registry.json`` says which version is in production.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time

from pipeline.atomic import fsync_dir, write_atomically

FORMAT = "sparsepipe-registry"
FORMAT_VERSION = 1


class RegistryError(Exception):
    """A registry that cannot be used as asked; the message names the file."""


class LockedError(RegistryError):
    """Another process holds the registry's job lock."""


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory, fsync, os.replace."""
    write_atomically(path, lambda f: f.write(data))


def atomic_write_json(path: str, obj) -> None:
    atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def read_jsonl(path: str, required: tuple = ()) -> list[dict]:
    """Records of a JSON-lines file; a line torn by a kill is skipped (the run log is appended to, and closes a torn
    record with a newline). With ``required`` keys (the index, which is rewritten whole) any line but a torn last
    one that does not parse, or a record without those keys, is a RegistryError naming the file and the line: a
    damaged index must stop the job, not shrink what it lists (retention deletes what is unlisted)."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return out
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == last or not required:
                continue
            raise RegistryError(f"{path}:{i + 1}: not a JSON record; the file is damaged (restore it from a "
                                f"backup)") from None
        if not isinstance(rec, dict) or any(k not in rec for k in required):
            raise RegistryError(f"{path}:{i + 1}: a record without {', '.join(required) or 'fields'}; the file "
                                f"is damaged (restore it from a backup)")
        out.append(rec)
    return out


class Registry:
    def __init__(self, path: str):
        self.path = os.fspath(path).rstrip("/")
        self.meta_path = os.path.join(self.path, "registry.json")
        self.index_path = os.path.join(self.path, "index.jsonl")
        self.log_path = os.path.join(self.path, "runs.jsonl")
        self.models_dir = os.path.join(self.path, "models")
        self.runs_dir = os.path.join(self.path, "runs")
        self.lock_path = os.path.join(self.path, "retrain.lock")

    # ------------------------------------------------------------------------------------ pointer
    def meta(self) -> dict:
        try:
            with open(self.meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except FileNotFoundError:
            raise RegistryError(f"{self.meta_path}: not a sparsepipe registry (no registry.json)") from None
        except json.JSONDecodeError as e:
            raise RegistryError(f"{self.meta_path}: unreadable registry metadata ({e})") from None
        if meta.get("format") != FORMAT:
            raise RegistryError(f"{self.meta_path}: not a sparsepipe registry")
        if int(meta.get("format_version", 0)) > FORMAT_VERSION:
            raise RegistryError(f"{self.meta_path}: registry format {meta['format_version']} is newer than this "
                                f"sparsepipe ({FORMAT_VERSION}); upgrade sparsepipe")
        return meta

    def _write_meta(self, meta: dict) -> None:
        meta = {**meta, "updated": now()}
        atomic_write_json(self.meta_path, meta)

    @property
    def production_version(self) -> int | None:
        return self.meta().get("production")

    @property
    def previous_production(self) -> int | None:
        prev = self.meta().get("previous") or []
        return prev[-1] if prev else None

    # ------------------------------------------------------------------------------------ index
    def versions(self) -> list[dict]:
        """Index records, oldest first, each with ``production`` (bool) and ``path`` (absolute)."""
        prod = self.production_version
        out = []
        for rec in self._index():
            rec = dict(rec)
            rec["production"] = rec["version"] == prod
            rec["path"] = os.path.abspath(os.path.join(self.path, rec["file"]))
            out.append(rec)
        return out

    def version(self, version: int) -> dict:
        for rec in self.versions():
            if rec["version"] == int(version):
                return rec
        raise RegistryError(f"{self.index_path}: no version {version}")

    def find_run(self, run: str) -> dict | None:
        return next((r for r in self.versions() if r.get("run") == run), None)

    def next_version(self) -> int:
        return max([r["version"] for r in self._index()] + [self.meta().get("last_version", 0)]) + 1

    def _index(self) -> list[dict]:
        return read_jsonl(self.index_path, ("version", "file"))

    def model_file(self, version: int) -> str:
        return os.path.join(self.models_dir, f"v{int(version):06d}.npz")

    def _write_index(self, records: list[dict]) -> None:
        drop = ("production", "path")
        body = "".join(json.dumps({k: v for k, v in r.items() if k not in drop}, sort_keys=True) + "\n"
                       for r in records)
        atomic_write(self.index_path, body.encode())

    def add_version(self, model, record: dict, fault=None) -> dict:
        """Copy ``model`` (a Model) into models/ and list it in the index (model file first, then index)."""
        version = int(record["version"])
        path = self.model_file(version)
        model.save(path)
        fsync_dir(self.models_dir)
        if fault:
            fault("during_promote")
        rec = {**record, "file": os.path.relpath(path, self.path), "created": record.get("created") or now()}
        records = [r for r in self._index() if r["version"] != version] + [rec]
        self._write_index(sorted(records, key=lambda r: r["version"]))
        meta = self.meta()
        if meta.get("last_version", 0) < version:
            meta["last_version"] = version
            self._write_meta(meta)
        return self.version(version)

    # ------------------------------------------------------------------------------------ production
    def production(self):
        """The production Model (None when nothing was promoted yet); a missing or corrupt file is an error
        naming it."""
        from pipeline.model import load_model

        v = self.production_version
        if v is None:
            return None
        path = self.model_file(v)
        if not os.path.exists(path):
            raise RegistryError(f"{path}: production model (version {v}) is missing; restore it or "
                                f"`sparsepipe registry promote {self.path} VERSION` another version")
        try:
            m = load_model(path)
        except Exception as e:  # noqa: BLE001  (ModelError, BadZipFile, truncated arrays, ...)
            raise RegistryError(f"{path}: production model (version {v}) is unreadable ({e})") from None
        m.meta["path"] = path
        m.meta["registry_version"] = v
        return m

    def promote(self, version: int, run: str | None = None, reason: str = "") -> dict:
        """Move the production pointer to ``version`` (atomic); the old one goes on the previous stack."""
        version = int(version)
        rec = self.version(version)
        if not os.path.exists(rec["path"]):
            raise RegistryError(f"{rec['path']}: model file of version {version} is missing")
        meta = self.meta()
        old = meta.get("production")
        if old == version:
            return {"production": version, "previous": old, "changed": False}
        meta["previous"] = [v for v in (meta.get("previous") or []) if v != version] + ([old] if old else [])
        meta["production"] = version
        self._write_meta(meta)
        self.log({"event": "promote", "version": version, "previous": old, "run": run, "reason": reason})
        return {"production": version, "previous": old, "changed": True}

    def rollback(self) -> dict:
        """Production back to the previous production version (atomic), recorded in the run log."""
        meta = self.meta()
        prev = list(meta.get("previous") or [])
        prev = [v for v in prev if os.path.exists(self.model_file(v))]
        if not prev:
            raise RegistryError(f"{self.meta_path}: no previous production version to roll back to")
        old = meta.get("production")
        target = prev.pop()
        meta["previous"], meta["production"] = prev, target
        self._write_meta(meta)
        self.log({"event": "rollback", "version": target, "from": old})
        return {"production": target, "from": old}

    # ------------------------------------------------------------------------------------ retention
    def retention(self, keep: int, fault=None) -> list[int]:
        """Delete versions beyond the newest ``keep``, never production nor the previous production.
        The index is rewritten first, then files go: a kill in between leaves unlisted files only."""
        if keep < 1:
            raise ValueError(f"retention keep must be >= 1, got {keep}")
        records = self._index()
        protect = {self.production_version, self.previous_production}
        newest = {r["version"] for r in sorted(records, key=lambda r: r["version"])[-keep:]}
        gone = [r["version"] for r in records if r["version"] not in newest and r["version"] not in protect]
        if gone:
            self._write_index([r for r in records if r["version"] not in gone])
            if fault:
                fault("during_retention")

            for v in gone:
                try:
                    os.unlink(self.model_file(v))
                except FileNotFoundError:
                    pass
        listed = {r["version"] for r in self._index()}
        meta = self.meta()
        prev = [v for v in meta.get("previous") or [] if v in listed]
        if prev != (meta.get("previous") or []):
            meta["previous"] = prev
            self._write_meta(meta)
        self.clean_orphans()
        return gone

    def clean_orphans(self) -> list[str]:
        """Remove model files the index does not list (left by a kill during registration or retention)
        and temporary files."""
        listed = {os.path.basename(r["file"]) for r in self._index()}
        prod = self.meta().get("production")  # (a previous version may be unlisted: retention killed midway)
        if prod is not None and os.path.basename(self.model_file(prod)) not in listed:
            raise RegistryError(f"{self.index_path}: does not list version {prod}, which {self.meta_path} names as "
                                f"production; the index is damaged (restore it from a backup); nothing was deleted")
        removed = []
        for name in sorted(os.listdir(self.models_dir)):
            if name not in listed:
                os.unlink(os.path.join(self.models_dir, name))
                removed.append(name)
        for name in os.listdir(self.path):
            if name.startswith(".") and name.endswith(".tmp"):
                os.unlink(os.path.join(self.path, name))
                removed.append(name)
        return removed

    # ------------------------------------------------------------------------------------ refused generations
    def refused(self, store_id: str) -> list[int]:
        return sorted({r["generation"] for r in self.meta().get("refused", []) if r["store_id"] == store_id})

    def set_refused(self, store_id: str, generation: int, refused: bool, run: str) -> None:
        meta = self.meta()
        rest = [r for r in meta.get("refused", []) if not (r["store_id"] == store_id and r["generation"] == generation)]
        if refused:
            rest.append({"store_id": store_id, "generation": generation, "run": run, "at": now()})
        if rest != meta.get("refused", []):
            meta["refused"] = rest
            self._write_meta(meta)

    # ------------------------------------------------------------------------------------ run log
    def log(self, record: dict) -> None:
        """Append one record to runs.jsonl (O_APPEND, fsync)."""
        line = json.dumps({"at": now(), **record}, sort_keys=True, default=str) + "\n"
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # a record torn by a kill is closed by a newline so the next one stays on its own line
            if os.fstat(fd).st_size:
                with open(self.log_path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        line = "\n" + line
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def run_log(self) -> list[dict]:
        return read_jsonl(self.log_path)

    # ------------------------------------------------------------------------------------ runs
    def run_dir(self, run: str) -> str:
        d = os.path.join(self.runs_dir, run)
        os.makedirs(d, exist_ok=True)
        return d

    def run_state(self, run: str) -> dict | None:
        p = os.path.join(self.runs_dir, run, "state.json")
        try:
            with open(p, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as e:
            raise RegistryError(f"{p}: unreadable run state ({e})") from None

    def save_run_state(self, run: str, state: dict) -> None:
        atomic_write_json(os.path.join(self.run_dir(run), "state.json"), state)

    # ------------------------------------------------------------------------------------ lock
    def lock(self, run: str = "") -> "JobLock":
        return JobLock(self, run)


class JobLock:
    """The registry's job lock: an flock on REG/retrain.lock (released by the kernel when the holder dies)
    whose content names the holder. Content left by a holder that is gone is a stale lock: taken over and
    recorded in the run log."""

    def __init__(self, reg: Registry, run: str):
        self.reg, self.run, self.fd = reg, run, None
        self.stale = None

    def __enter__(self):
        fd = os.open(self.reg.lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise LockedError(f"{self.reg.lock_path}: another retrain run holds the lock "
                              f"({_describe(holder)})") from None
        holder = _read_holder(fd)
        if holder:
            self.stale = holder
            alive = pid_alive(holder.get("pid")) and holder.get("host") == socket.gethostname()
            self.reg.log({"event": "stale_lock_taken_over", "run": self.run, "holder": holder,
                          "holder_process": "alive (lock not held)" if alive else "gone"})
        self.fd = fd
        self.set_run(self.run)
        return self

    def set_run(self, run: str) -> None:
        """Record the holder (pid, host, run) in the lock file."""
        self.run = run
        info = {"pid": os.getpid(), "host": socket.gethostname(), "run": run, "since": now()}
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, json.dumps(info).encode(), 0)
            os.fsync(self.fd)
        except OSError as e:
            raise OSError(e.errno, e.strerror, self.reg.lock_path) from None

    def __exit__(self, *exc):
        if self.fd is not None:
            os.ftruncate(self.fd, 0)  # an empty file: released cleanly
            os.fsync(self.fd)
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None
        return False


def _read_holder(fd) -> dict | None:
    try:
        raw = os.pread(fd, 4096, 0)
    except OSError:
        return None
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return {"raw": raw.decode(errors="replace")}


def _describe(holder) -> str:
    if not holder:
        return "its holder has not recorded itself yet (it has just started)"
    return f"pid {holder.get('pid')} on {holder.get('host')}, run {holder.get('run')}, since {holder.get('since')}"


def pid_alive(pid) -> bool:
    """Whether a process with this id exists on this host (one we may not signal counts as alive)."""
    try:
        os.kill(int(pid), 0)
    except (TypeError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def init_registry(path: str) -> Registry:
    """Create the registry directory (idempotent) and return it."""
    path = os.fspath(path).rstrip("/")
    os.makedirs(os.path.join(path, "models"), exist_ok=True)
    os.makedirs(os.path.join(path, "runs"), exist_ok=True)
    reg = Registry(path)
    if not os.path.exists(reg.meta_path):
        atomic_write_json(reg.meta_path, {"format": FORMAT, "format_version": FORMAT_VERSION, "production": None,
                                          "previous": [], "refused": [], "last_version": 0, "created": now()})
    reg.meta()
    return reg


def open_registry(path, create: bool = False) -> Registry:
    """Open a registry directory (``create``: make it when missing). A newer format is refused."""
    path = os.fspath(path)
    if create:
        return init_registry(path)
    if not os.path.isdir(path):
        raise RegistryError(f"{path}: no such registry")
    reg = Registry(path)
    reg.meta()
    return reg
