"""A clean error for every bad input, in every command: real subprocesses of the CLI; for each case exit code
!= 0, one 'error: ...' line naming the thing and the cause, no traceback (worker logs included) and nothing
half-written. SPARSEPIPE_DEBUG=1 / --debug shows the traceback. No lock file stays after an ingest."""
import contextlib
import gzip
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from pipeline.store import format as fmt

ENV = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEPIPE_")}


def cli(*args, env=None, preexec_fn=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], capture_output=True, text=True,
                          env={**ENV, **(env or {})}, preexec_fn=preexec_fn, timeout=timeout)


def assert_clean(r, *words, code=None):
    err = r.stderr.strip()
    assert r.returncode != 0, (r.returncode, r.stdout, r.stderr)
    if code is not None:
        assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "Compute Failed" not in r.stderr, r.stderr
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for w in words:
        assert str(w) in lines[0], (w, lines[0])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("errs")
    assert cli("synth", d / "s.svm", "--rows", "600", "--features", "2000", "--nnz-per-row", "15").returncode == 0
    r = cli("ingest", d / "s.svm", "--out", d / "st.zarr", "--block-mb", "0.02")
    assert r.returncode == 0, r.stderr
    r = cli("train", d / "st.zarr", "--out", d / "m.npz", "--passes", "1")
    assert r.returncode == 0, r.stderr
    return d


def _listing(d):
    return sorted(os.listdir(d))


def test_every_bad_input_is_one_clean_line(base, tmp_path):
    st, model, svm = base / "st.zarr", base / "m.npz", base / "s.svm"
    (tmp_path / "adir").mkdir()
    (tmp_path / "empty.svm").write_bytes(b"")
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "text.npz").write_text("hello\n")
    (tmp_path / "trunc.npz").write_bytes(model.read_bytes()[:2000])
    np.savez(tmp_path / "obj.npz", meta=np.array([{"format": "sparsepipe-model"}], dtype=object))  # pickled member
    (tmp_path / "trunc.svm.gz").write_bytes(gzip.compress(svm.read_bytes())[:5000])
    (tmp_path / "wrong.toml").write_text('passes = "five"\n')
    (tmp_path / "wrong2.toml").write_text('eta = true\n')
    (tmp_path / "bad.toml").write_text('passes = \n')
    one = tmp_path / "one.zarr"  # a file under --block-mb: one block, no holdout
    assert cli("ingest", svm, "--out", one).returncode == 0
    newer = tmp_path / "newer.zarr"
    shutil.copytree(st, newer)
    man = fmt.read_manifest(str(newer))
    man["format_version"] = fmt.FORMAT_VERSION + 1
    fmt.write_manifest(str(newer), man)
    t = tmp_path
    cases = [
        (("ingest", t / "adir", "--out", t / "o1.zarr"), ["adir", "is a directory"], 1),
        (("ingest", t / "empty.svm", "--out", t / "o2.zarr"), ["empty.svm", "empty"], 1),
        (("ingest", t / "missing.svm", "--out", t / "o3.zarr"), ["missing.svm", "no such file"], 1),
        (("ingest", t / "trunc.svm.gz", "--out", t / "o4.zarr"), ["trunc.svm.gz", "truncated"], 1),
        (("ingest", t / "trunc.svm.gz", "--out", t / "o5.zarr", "--workers", "1"), ["trunc.svm.gz", "truncated"], 1),
        (("evaluate", t / "trunc.npz", st), ["trunc.npz", "truncated or corrupt"], 1),
        (("evaluate", t / "empty.npz", st), ["empty.npz", "empty file"], 1),
        (("evaluate", t / "text.npz", st), ["text.npz", "not a sparsepipe model"], 1),
        (("evaluate", t / "obj.npz", st), ["obj.npz", "pickled object array"], 1),
        (("evaluate", t / "adir", st), ["adir", "is a directory"], 1),
        (("evaluate", t / "nope.npz", st), ["nope.npz", "no such model"], 1),
        (("evaluate", model, t / "adir"), ["adir", "not a sparsepipe store"], 1),
        (("evaluate", model, t / "empty.svm"), ["empty.svm", "not a store"], 1),
        (("evaluate", model, newer), ["newer.zarr", "newer"], 1),
        (("info", newer), ["newer.zarr", "newer"], 1),
        (("evaluate", model, one), ["one.zarr", "no blocks in split 'holdout'", "--split all"], 1),
        (("predict", t / "trunc.npz", svm, "--out", t / "p.txt"), ["trunc.npz"], 1),
        (("predict", model, t / "empty.npz", "--out", t / "p2.txt"), ["empty.npz"], 1),
        (("sparsify", t / "text.npz", "--store", st, "--nnz", "5", "--out", t / "sp.npz"), ["text.npz"], 1),
        (("train", st, "--out", t / "m1.npz", "--init-model", t / "trunc.npz"), ["trunc.npz"], 1),
        (("train", st, "--out", t / "m2.npz", "--config", t / "wrong.toml"), ["wrong.toml", "passes", "integer"], 2),
        (("train", st, "--out", t / "m3.npz", "--config", t / "wrong2.toml"), ["wrong2.toml", "eta", "number"], 2),
        (("train", st, "--out", t / "m4.npz", "--config", t / "bad.toml"), ["bad.toml", "invalid TOML"], 2),
        (("train", st, "--out", t / "m5.npz", "--config", t / "adir"), ["adir", "directory"], 1),
        (("train", st, "--out", t / "m6.npz", "--workers", "0"), ["--workers"], 2),
        (("train", t / "adir", "--out", t / "m7.npz"), ["adir", "not a sparsepipe store"], 1),
        (("stability", st, "--workers", "0"), ["--workers"], 2),
        (("train", st, "--out", t / "m8.npz", "--algo", "nope"), ["nope", "unknown algorithm"], 2),
        (("verify", t / "adir"), ["adir"], 1),
        (("evaluate", model, st, "--split", "test"), ["--split", "'test'", "holdout"], 2),
        (("sparsify", model, "--store", st, "--nnz", "5", "--method", "l1", "--out", t / "sp2.npz"),
         ["--method", "'l1'", "dd | mg"], 2),
        (("sparsify", model, "--store", st, "--nnz", "5", "--nnz-mode", "x", "--out", t / "sp3.npz"), ["--nnz-mode"], 2),
        (("refit", model, st, "--out", t / "r.npz", "--l1", "0", "--kkt", "1"), ["--kkt", "L1 penalty", "--l1"], 2),
        (("train", st, "--out", t / "m9.npz", "--refit-l1", "0", "--refit-kkt", "0"), ["--refit-kkt", "--refit-l1"], 2),
        (("train", st, "--out", t / "m10.npz", "--workers", "1", "--scheduler", "tcp://127.0.0.1:1"),
         ["--workers 1 and --scheduler", "give one"], 2),
        (("train", st, "--out", t / "m11.npz", "--placement", "both"), ["--placement", "paths | single"], 2),
        (("train", st, "--out", t / "m12.npz", "--gravity", "0.001"), ["--gravity", "sgd, tg", "--set gravity="], 2),
        (("sparsify", model, "--store", st, "--epsilon", "0", "--out", t / "sp4.npz"), ["--epsilon", "> 0"], 2),
        (("ingest", svm, svm, "--out", t / "o6.zarr"), ["given twice"], 1),
    ]
    before = _listing(t)
    for args, words, code in cases:
        r = cli(*args)
        assert_clean(r, *words, code=code)
    assert _listing(t) == before  # nothing half-written: no store, model, prediction, tmp or lock file
    assert not [p for p in os.listdir(base) if p.endswith(".lock") or ".tmp" in p]


def test_scheduler_that_does_not_answer_is_a_clean_error_in_bounded_time(base, tmp_path):
    t0 = time.time()
    r = cli("train", base / "st.zarr", "--out", tmp_path / "m.npz", "--scheduler", "tcp://127.0.0.1:9",
            env={"SPARSEPIPE_CONNECT_TIMEOUT": "2"}, timeout=120)
    assert_clean(r, "tcp://127.0.0.1:9", "no Dask scheduler answers", code=1)
    assert time.time() - t0 < 60 and not (tmp_path / "m.npz").exists()


def test_a_bad_scheduler_address_or_timeout_is_a_usage_error_naming_it(base, tmp_path):
    for addr in ("127.0.0.1:notaport", "foo://x"):
        r = cli("train", base / "st.zarr", "--out", tmp_path / "m.npz", "--scheduler", addr, timeout=120)
        assert_clean(r, f"--scheduler {addr}: not a scheduler address", "tcp://HOST:PORT", code=2)
    r = cli("train", base / "st.zarr", "--out", tmp_path / "m.npz", "--scheduler", "tcp://127.0.0.1:9",
            env={"SPARSEPIPE_CONNECT_TIMEOUT": "abc"}, timeout=120)
    assert_clean(r, "SPARSEPIPE_CONNECT_TIMEOUT='abc'", code=2)
    assert _listing(tmp_path) == []


def test_a_scheduler_killed_mid_run_is_one_line_and_leaves_no_model(tmp_path):
    """A real external cluster (a scheduler and a worker process on loopback); SIGKILL of the scheduler while
    `train --scheduler` runs: one error line naming the address, exit 1, no model and no temporary file."""
    d = tmp_path
    assert cli("synth", d / "s.svm", "--rows", "3000", "--features", "20000", "--nnz-per-row", "40").returncode == 0
    assert cli("ingest", d / "s.svm", "--out", d / "st.zarr", "--block-mb", "0.05").returncode == 0
    bindir = os.path.dirname(sys.executable)
    sched = subprocess.Popen([os.path.join(bindir, "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                              "--no-dashboard", "--scheduler-file", str(d / "sched.json")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        deadline = time.time() + 60
        while not (d / "sched.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
        addr = json.loads((d / "sched.json").read_text())["address"]
        worker = subprocess.Popen([os.path.join(bindir, "dask"), "worker", addr, "--host", "127.0.0.1", "--nthreads",
                                   "1", "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run = subprocess.Popen([sys.executable, "-m", "cli.main", "train", str(d / "st.zarr"), "--out",
                                str(d / "m.npz"), "--algo", "tg", "--passes", "400", "--no-refit", "--scheduler", addr,
                                "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        for line in run.stderr:  # the run's JSON pass lines on stderr: kill once the passes run
            if line.startswith("{") and '"pass"' in line:
                break
        sched.send_signal(signal.SIGKILL)
        out, err = run.communicate(timeout=120)
        err = err.strip()
    finally:
        for p in (worker, sched):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert run.returncode == 1, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {addr}: lost the Dask scheduler mid-run"), err
    assert sorted(p for p in os.listdir(d) if "m.npz" in p) == []


def _small_filesystem(path):
    """A 24 KiB tmpfs at ``path`` (root), else None."""
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return None
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(path)], capture_output=True)
    return path if r.returncode == 0 else None


def test_full_disk_during_ingest_commits_nothing(base, tmp_path):
    small = _small_filesystem(tmp_path / "small")
    try:
        if small is not None:  # a real full filesystem: ENOSPC
            out, preexec = small / "s.zarr", None
        else:  # a file size limit: EFBIG
            out = tmp_path / "s.zarr"

            def preexec():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
        r = cli("ingest", base / "s.svm", "--out", out, "--block-mb", "0.5", preexec_fn=preexec)
        assert_clean(r, str(out), "cannot write the store", "nothing was committed", code=1)
        assert os.listdir(out.parent) == []  # no store, no STORE.tmp-*, no lock
    finally:
        if small is not None:
            subprocess.run(["umount", str(small)], check=False)


def test_a_full_disk_names_the_output_and_leaves_nothing(base, tmp_path):
    """ENOSPC while saving the model or the --record-path file: the error names the file, no temporary file stays,
    and a record that cannot be written leaves no model either (it is written first). Without root to mount a
    full filesystem, a file size limit the outputs exceed gives EFBIG the same way."""
    out = tmp_path / "small"
    small = _small_filesystem(out)
    preexec, cause, kept = None, "No space left on device", ["fill"]
    if small is not None:
        fd = os.open(small / "fill", os.O_CREAT | os.O_WRONLY)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"x" * 1024)
        os.close(fd)
    else:  # a record line and a model file are both longer than 64 bytes

        def preexec():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

        cause, kept = "File too large", []
    try:
        for args, name in ((["--out", out / "m.npz"], "m.npz"),
                           (["--out", tmp_path / "m.npz", "--record-path", out / "r.jsonl"], "r.jsonl")):
            r = cli("train", base / "st.zarr", "--algo", "tg", "--passes", "1", *args, preexec_fn=preexec)
            last = r.stderr.strip().splitlines()[-1]  # after the pass's progress line
            assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
            assert last.startswith("error: ") and str(out / name) in last and cause in last, last
            assert os.listdir(out) == kept and not (tmp_path / "m.npz").exists()
    finally:
        if small is not None:
            subprocess.run(["umount", str(small)], check=False)


def test_debug_shows_the_traceback(base, tmp_path):
    (tmp_path / "trunc.npz").write_bytes((base / "m.npz").read_bytes()[:2000])
    r = cli("--debug", "evaluate", tmp_path / "trunc.npz", base / "st.zarr")
    assert r.returncode == 1 and "Traceback" in r.stderr and "error: " in r.stderr
    r = cli("evaluate", tmp_path / "trunc.npz", base / "st.zarr", env={"SPARSEPIPE_DEBUG": "1"})
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_no_lock_file_after_ingest_and_a_held_lock_still_refuses(base, tmp_path):
    from pipeline.ingest import IngestError, _lock, _unlock, ingest

    out = tmp_path / "s.zarr"
    r = cli("ingest", base / "s.svm", "--out", out, "--block-mb", "0.05", "--holdout", "0")
    assert r.returncode == 0, r.stderr
    assert _listing(tmp_path) == ["s.zarr"]
    r = cli("info", tmp_path / "s.zarr")
    assert r.returncode == 0
    (tmp_path / "t.svm").write_text("+1 1:1\n-1 2:1\n")
    r = cli("ingest", tmp_path / "t.svm", "--out", out, "--append")
    assert r.returncode == 0, r.stderr
    assert _listing(tmp_path) == ["s.zarr", "t.svm"]
    fd = _lock(str(tmp_path / "x.zarr"))  # another writer holds it: refused, and its lock stays its own
    try:
        r = cli("ingest", base / "s.svm", "--out", tmp_path / "x.zarr")
        assert_clean(r, "another sparsepipe process is writing", code=1)
        with pytest.raises(IngestError):
            ingest([str(base / "s.svm")], str(tmp_path / "x.zarr"))
        assert (tmp_path / "x.zarr.lock").exists() and not (tmp_path / "x.zarr").exists()
    finally:
        _unlock(str(tmp_path / "x.zarr"), fd)
    assert not (tmp_path / "x.zarr.lock").exists()
    # the same store through a symlink is the same writer's lock (two appends through two spellings wrote the
    # same generation's blocks and deleted each other's)
    (tmp_path / "link.zarr").symlink_to(out)
    fd = _lock(str(out))
    try:
        r = cli("ingest", tmp_path / "t.svm", "--out", tmp_path / "link.zarr", "--append")
        assert_clean(r, "another sparsepipe process is writing", code=1)
    finally:
        _unlock(str(out), fd)


def test_json_runs_print_one_json_line_per_pass_on_stderr_when_not_a_terminal(base, tmp_path):
    r = cli("train", base / "st.zarr", "--out", tmp_path / "m.npz", "--passes", "3", "--json")
    assert r.returncode == 0, r.stderr
    final = json.loads(r.stdout)
    assert final["passes"] == 3
    lines = [json.loads(ln) for ln in r.stderr.strip().splitlines()]
    assert [ln["pass"] for ln in lines] == [1, 2, 3] and all(ln["event"] == "pass" for ln in lines)
    assert all("density" in ln and "holdout" in ln for ln in lines)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_unreadable_inputs_without_root_file_access(base, tmp_path):
    """Root reads anything; drop its file-access capabilities so the permission bits apply."""
    secret = tmp_path / "secret.svm"
    secret.write_text("+1 1:1\n")
    model = tmp_path / "secret.npz"
    model.write_bytes((base / "m.npz").read_bytes())
    cfg = tmp_path / "secret.toml"
    cfg.write_text("passes = 1\n")
    for p in (secret, model, cfg):
        p.chmod(0)
    drop = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]

    def run(*args):
        return subprocess.run([*drop, sys.executable, "-m", "cli.main", *map(str, args)], capture_output=True,
                              text=True, env=ENV, timeout=300)

    assert_clean(run("ingest", secret, "--out", tmp_path / "o.zarr"), "secret.svm", "permission denied", code=1)
    assert_clean(run("evaluate", model, base / "st.zarr"), "secret.npz", "not readable", code=2)
    assert_clean(run("train", base / "st.zarr", "--out", tmp_path / "m.npz", "--config", cfg), "secret.toml",
                 "not readable", code=2)
    assert sorted(os.listdir(tmp_path)) == ["secret.npz", "secret.svm", "secret.toml"]


def test_outputs_are_checked_before_any_work(tmp_path):
    """A model, prediction or synth output that cannot be written is an error naming it before the command
    trains or generates anything (not after an hour of training)."""
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], capture_output=True, text=True)

    for args, cause in [(["train", tmp_path / "none.zarr", "--out", tmp_path / "no" / "m.npz"], "does not exist"),
                        (["train", tmp_path / "none.zarr", "--out", tmp_path], "is a directory"),
                        (["synth", tmp_path / "no" / "x.svm", "--rows", "5"], "does not exist"),
                        (["predict", tmp_path / "m.npz", tmp_path / "x.svm", "--out", tmp_path / "no" / "p.txt"],
                         "does not exist")]:
        r = cli(*args)
        assert r.returncode == 1 and cause in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_outputs_go_through_a_symbolic_link_and_into_a_fifo_as_a_plain_write_would(base, tmp_path):
    """``--out`` naming a link replaces the link's target (the link stays a link), and a FIFO (a pipe, as
    /dev/stdout often is) is written into, not replaced by a regular file."""
    import threading

    (tmp_path / "target.txt").write_text("old")
    os.symlink("target.txt", tmp_path / "link.txt")
    svm = base / "s.svm"
    r = cli("predict", base / "m.npz", svm, "--out", tmp_path / "link.txt")
    assert r.returncode == 0, r.stderr
    assert os.path.islink(tmp_path / "link.txt")
    lines = (tmp_path / "target.txt").read_text().splitlines()
    assert len(lines) == 600 and len(lines[0].split()) == 2
    os.mkfifo(tmp_path / "fifo")
    got = []
    reader = threading.Thread(target=lambda: got.append((tmp_path / "fifo").read_text()))
    reader.start()
    r = cli("predict", base / "m.npz", svm, "--out", tmp_path / "fifo")
    reader.join(60)
    assert r.returncode == 0, r.stderr
    assert got and got[0].splitlines() == lines
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link.txt", "target.txt"]


def test_workers_and_scheduler_together_are_refused(tmp_path):
    from pipeline.cluster import dask_client

    with pytest.raises(ValueError, match=r"--workers 2 and --scheduler tcp://127.0.0.1:1: give one"):
        with dask_client(2, "tcp://127.0.0.1:1"):
            pass


def test_json_output_is_strict_json():
    """Non-finite numbers (an AUC on a one-class holdout, a bound of an all-zero model) are null, not NaN."""
    from cli.app import json_line

    line = json_line({"auc": float("nan"), "bound": np.float64("inf"), "w": np.array([1.0, np.nan]), "n": np.int64(3)})
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}")) == {
        "auc": None, "bound": None, "w": [1.0, None], "n": 3}


def test_every_command_takes_dash_h(base):
    for args in (["train"], ["ingest"], ["evaluate"], ["registry", "show"], ["refit"], ["synth"]):
        r = cli(*args, "-h")
        assert r.returncode == 0 and "Usage:" in r.stdout, (args, r.stderr)


def test_evaluate_notes_a_model_wider_than_the_store(base, tmp_path):
    """The weights past a narrower store's width score nothing there: evaluate says so (stderr) and counts them."""
    from pipeline.model import load_model

    assert cli("synth", tmp_path / "n.svm", "--rows", "200", "--features", "700", "--nnz-per-row", "10").returncode == 0
    assert cli("ingest", tmp_path / "n.svm", "--out", tmp_path / "n.zarr", "--block-mb", "0.005").returncode == 0
    m = load_model(base / "m.npz")
    beyond = int((m.coef_indices >= 700).sum())
    assert m.n_features == 2000 and beyond > 0
    r = cli("evaluate", base / "m.npz", tmp_path / "n.zarr", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["nnz_beyond_store"] == beyond
    assert f"its {beyond:,} non-zeros past the store's width score nothing here" in r.stderr
    r = cli("evaluate", base / "m.npz", base / "st.zarr", "--json")
    assert "nnz_beyond_store" not in json.loads(r.stdout) and "note:" not in r.stderr


def test_evaluate_notes_a_model_of_the_other_label_kind(base, tmp_path):
    """A regression model evaluated on a binary store gets classification metrics: evaluate says so."""
    rows = [f"{0.5 * k - 3:g} 1:{k % 7 + 1} 2:{k % 3 + 1}" for k in range(300)]
    (tmp_path / "r.svm").write_text("\n".join(rows) + "\n")
    assert cli("ingest", tmp_path / "r.svm", "--out", tmp_path / "r.zarr", "--block-mb", "0.001").returncode == 0
    r = cli("train", tmp_path / "r.zarr", "--algo", "tg", "--loss", "squared", "--passes", "1", "--out",
            tmp_path / "r.npz")
    assert r.returncode == 0, r.stderr
    r = cli("evaluate", tmp_path / "r.npz", base / "st.zarr")
    assert r.returncode == 0 and "note: " in r.stderr, r.stderr
    assert "was trained on regression labels" in r.stderr and "are binary" in r.stderr


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_and_sigterm_stop_a_cluster_run_with_one_line(base, tmp_path, sig, code, word):
    """Ctrl-C reaches the terminal's whole process group (workers of --workers 2 included): one 'error:' line
    and exit 130, no worker tracebacks, nothing written, no process left. SIGTERM (systemd, `timeout`) to the
    command: the same clean stop, exit 143."""
    out = tmp_path / "m.npz"
    p = subprocess.Popen([sys.executable, "-m", "cli.main", "train", str(base / "st.zarr"), "--out", str(out),
                          "--algo", "tg", "--passes", "100000", "--workers", "2"], stderr=subprocess.PIPE,
                         text=True, env=ENV, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in p.stderr:  # the workers run passes
            if line.startswith("pass") and " 3 " in line[:10]:
                break
        (os.killpg if sig == signal.SIGINT else os.kill)(p.pid, sig)
        rest = p.stderr.read()
        assert p.wait(timeout=60) == code, rest
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    lines = [ln for ln in rest.splitlines() if not ln.startswith("pass")]
    assert "Traceback" not in rest and len(lines) == 1 and lines[0].startswith(f"error: {word}"), rest
    assert not out.exists() and sorted(os.listdir(tmp_path)) == []
    time.sleep(1)
    left = subprocess.run(["ps", "-o", "pid=,args=", "-s", str(p.pid)], capture_output=True, text=True).stdout.splitlines()
    assert [ln for ln in left if "<defunct>" not in ln] == [], left  # no worker outlived the command (an exited
    # one stays a zombie where the container's first process reaps nothing)


def test_library_calls_take_paths_and_check_their_settings(base, tmp_path):
    """What a script or notebook passes: a Path or one file name, an options dict, a model file name; settings
    `train` refuses are ValueErrors naming them, not ZeroDivisionError or a silent default."""
    from pathlib import Path

    from pipeline.evaluate import evaluate_store
    from pipeline.ingest import ingest
    from pipeline.model import load_model
    from pipeline.train import fit

    s = ingest(str(base / "s.svm"), Path(tmp_path / "one.zarr"), {"block_mb": 0.02, "holdout": 0.2})
    assert s["n_rows"] == 600 and s["holdout_blocks"] > 0
    st = str(base / "st.zarr")
    for kw, word in (({"evaluate_every": 0}, "'evaluate_every' must be >= 1"), ({"passes": 0}, "'passes' must be >= 1"),
                     ({"passes": "2"}, "'passes' must be an integer"), ({"placement": "bogus"}, "'placement' must be one of"),
                     ({"max_density": -1.0}, "'max_density' must be >= 0")):
        with pytest.raises(ValueError, match=word):
            fit(st, "tg", {}, **kw)
    m = fit(st, "tg", {}, passes=2, init_model=str(base / "m.npz"))  # a model file's name: warm start from it
    assert m.meta["provenance"]["init_model"] == str(base / "m.npz") and m.meta["provenance"]["resumed"] is False
    assert evaluate_store(str(base / "m.npz"), st) == evaluate_store(load_model(base / "m.npz"), st)


def test_an_interrupt_whose_exception_was_swallowed_still_stops_the_work():
    """Python drops an exception raised in a garbage-collection callback (Dask installs one): the command's
    handler records the signal, and the engine's stage report and the nightly job's steps raise it again."""
    from pipeline import interrupt
    from pipeline.retrain import fault

    fault("after_append")  # nothing received: nothing happens
    interrupt.RECEIVED.append(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            fault("after_append")
    finally:
        interrupt.RECEIVED.clear()


def test_on_a_terminal_each_pass_line_is_kept_whole_and_ctrl_c_gives_the_cursor_back(base, tmp_path):
    """A terminal (a real pseudo-terminal here): every pass's line, holdout error included, is printed whole
    above the bar (it was cut to the terminal's width inside the bar); Ctrl-C closes the bar first, so the cursor
    the bar hid is shown again before the error line."""
    import pty

    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "cli.main", "train", str(base / "st.zarr"), "--out",
                          str(tmp_path / "m.npz"), "--algo", "tg", "--passes", "100000"],
                         stdin=slave, stdout=slave, stderr=slave, env={**ENV, "COLUMNS": "60"},
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    out = b""
    try:
        while out.count(b"holdout error") < 3:
            out += os.read(master, 65536)
        os.kill(p.pid, signal.SIGINT)
        assert p.wait(timeout=60) == 130
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                out += chunk
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    text = out.decode(errors="replace")
    assert any(ln.lstrip("\x1b[2K").startswith("pass") and "holdout error" in ln and "logloss" in ln
               for ln in text.splitlines())
    hide, show = text.rfind("\x1b[?25l"), text.rfind("\x1b[?25h")
    assert hide >= 0 and show > hide and text.find("error: interrupted", show) > show
    assert not (tmp_path / "m.npz").exists()


def test_ingest_notes_a_holdout_far_from_the_share_asked(base, tmp_path):
    r = cli("ingest", base / "s.svm", "--out", tmp_path / "one.zarr")  # one block of --block-mb 64: no holdout
    assert r.returncode == 0 and "note: 0 of the 600 new rows (0%) are held out, against --holdout 0.1" in r.stderr
    r = cli("ingest", base / "s.svm", "--out", tmp_path / "many.zarr", "--block-mb", "0.01")
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr


def test_version_and_a_models_short_repr(base):
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("sparsepipe ")
    from pipeline.model import load_model

    m = load_model(base / "m.npz")
    assert repr(m).startswith(f"Model(stsgd, {m.nnz:,} non-zeros of 2,000 features") and len(repr(m)) < 200


def test_numerically_hard_but_valid_data_gets_clear_answers(tmp_path):
    """Values a float32 store cannot hold are refused at their line (were stored as inf); a one-class holdout
    prints AUC n/a (was an unexpected TypeError after the model was saved); squares past float64 are named; a
    SMIDAS run whose θ overflowed (its link maps θ = inf to w = 0) is a divergence, not an all-zero model."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(900):
        idx = np.sort(rng.choice(300, 12, replace=False))
        val = rng.normal(size=12)
        rows.append((idx, val, float(val[:4].sum())))

    def write(name, label, scale=1.0, extra=""):
        with open(tmp_path / name, "w") as f:
            for i, (idx, val, y) in enumerate(rows):
                f.write(f"{label(y)} " + " ".join(f"{j + 1}:{v * scale:.9g}" for j, v in zip(idx, val))
                        + (extra if i == 7 else "") + "\n")
        return tmp_path / name

    big = write("big.svm", lambda y: "+1" if y > 0 else "-1", extra=" 301:3.5e38")
    r = cli("ingest", big, "--out", tmp_path / "big.zarr")
    assert_clean(r, "big.svm:8:", "beyond the store's float32 range", "--dtype float64", code=1)
    assert cli("ingest", big, "--out", tmp_path / "big64.zarr", "--dtype", "float64").returncode == 0
    r = cli("ingest", write("bigy.svm", lambda y: "1e39" if y > 3 else repr(y)), "--out", tmp_path / "y.zarr",
            "--labels", "regression", "--dtype", "float64")
    assert r.returncode == 1 and "label beyond float32's range" in r.stderr and not (tmp_path / "y.zarr").exists()

    one = write("one.svm", lambda y: "+1")
    assert cli("ingest", one, "--out", tmp_path / "one.zarr", "--block-mb", "0.01").returncode == 0
    r = cli("train", tmp_path / "one.zarr", "--out", tmp_path / "one.npz", "--passes", "1")
    assert r.returncode == 0 and "AUC n/a" in r.stdout, r.stderr

    huge = write("huge.svm", lambda y: "+1" if y > 0 else "-1", scale=1e160)
    assert cli("ingest", huge, "--out", tmp_path / "huge.zarr", "--dtype", "float64", "--block-mb", "0.01").returncode == 0
    r = cli("train", tmp_path / "huge.zarr", "--out", tmp_path / "h.npz", "--algo", "tg", "--passes", "1")
    assert_clean(r, "huge.zarr", "squares of its values overflow float64", code=1)

    reg = write("reg.svm", repr)
    assert cli("ingest", reg, "--out", tmp_path / "reg.zarr", "--labels", "regression", "--block-mb", "0.01").returncode == 0
    r = cli("train", tmp_path / "reg.zarr", "--out", tmp_path / "s.npz", "--algo", "smidas", "--set", "loss=squared",
            "--eta", "1000", "--passes", "6")
    assert r.returncode == 1 and "--algo smidas diverged" in r.stderr and not (tmp_path / "s.npz").exists()

    from pipeline.sparsify import draws_for_epsilon

    with pytest.raises(ValueError, match="not finite .* --nnz instead"):
        draws_for_epsilon(np.array([1e300, 1e300]), np.array([1e300, 1e300]), 0.1, 0.1, "dd")
