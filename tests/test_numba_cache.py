"""numba's on-disk cache is keyed by the stamps of every file with numba kernels (pipeline.NUMBA_SOURCES): a kernel
that inlines a function of another file is recompiled when that file changes."""
import os
import subprocess
import sys

import pipeline

ROOT = os.path.dirname(os.path.abspath(pipeline.__file__))


def test_the_stamped_sources_hold_every_file_that_compiles_with_numba():
    with_numba = set()
    for d, _, files in os.walk(ROOT):
        for f in files:
            path = os.path.join(d, f)
            if f.endswith(".py") and ("njit" in open(path, encoding="utf-8").read()):
                with_numba.add(os.path.relpath(path, ROOT))
    covered = {s for s in with_numba if any(s == r or s.startswith(r + os.sep) for r in pipeline.NUMBA_SOURCES)}
    assert with_numba and covered == with_numba, with_numba - covered


def test_a_changed_kernel_source_moves_the_cache_directory(tmp_path):
    """A copy of the package: touching the losses (inlined by other kernels' files) names another directory."""
    import shutil

    pkg = tmp_path / "pipeline"
    shutil.copytree(ROOT, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    code = "import pipeline, os; print(os.environ['NUMBA_CACHE_DIR'])"

    def cache_dir():
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    before = cache_dir()
    assert before.startswith(str(pkg)) and before == cache_dir()
    losses = pkg / "kernels" / "losses.py"
    losses.write_text(losses.read_text() + "\n")
    assert cache_dir() != before
