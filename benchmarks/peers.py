"""Peers used as baselines (never by the library): Vowpal Wabbit (Python API) and scikit-learn."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def libsvm_to_vw(src: Path, dst: Path) -> Path:
    """LIBSVM 'y j:v ...' -> VW 'y | j:v ...' (feature names are the indices)."""
    if dst.exists():
        return dst
    tmp = dst.with_suffix(".tmp")
    with open(src, "rb") as f, open(tmp, "wb") as g:
        for line in f:
            lab, _, rest = line.partition(b" ")
            lab = b"1" if float(lab) > 0 else b"-1"
            g.write(lab + b" | " + rest if rest else lab + b" |\n")
    tmp.rename(dst)
    return dst


def vw_train(vw_file: Path, workdir: Path, passes: int, l1: float, b: int = 24, lr: float | None = None,
             loss: str = "logistic") -> dict:
    """Train VW from its cache (the cache is built by a first, untimed run); returns timing and the model path."""
    import vowpalwabbit

    cache = workdir / (vw_file.name + ".cache")
    model = workdir / f"vw_l1_{l1:g}.model"
    readable = workdir / f"vw_l1_{l1:g}.txt"
    base = f"--quiet --loss_function {loss} -b {b} --holdout_off --l1 {l1:g}" + (f" -l {lr:g}" if lr else "")
    if not cache.exists():
        vowpalwabbit.Workspace(f"-d {vw_file} --cache_file {cache} --passes 1 {base} --noop").finish()
    t0, c0 = time.perf_counter(), time.process_time()
    ws = vowpalwabbit.Workspace(f"-d {vw_file} --cache_file {cache} --passes {passes} {base} -f {model} "
                                f"--readable_model {readable}")
    ws.finish()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    import re

    const = 11650396 % (1 << b)  # VW's constant (bias) feature slot
    pat = re.compile(r"^(\d+):(\S+)")
    weights, l1_state = [], 0.0
    with open(readable) as f:
        for line in f:
            if line.startswith("l1_state"):
                l1_state = float(line.split()[1])
            m = pat.match(line)
            if m and int(m.group(1)) != const:
                weights.append(float(m.group(2)))
    # VW applies --l1 lazily: predictions use sign(w)·max(|w| − l1_state, 0); saved weights are raw
    nnz_w = int(np.count_nonzero(np.abs(np.asarray(weights)) > l1_state))
    return {"seconds": secs, "cpu_seconds": cpu, "model": str(model), "nnz_weights": nnz_w}


def vw_predict(model: str, X, loss: str = "logistic") -> np.ndarray:
    """Raw scores of a trained VW model on the rows of a scipy CSR matrix."""
    import vowpalwabbit

    ws = vowpalwabbit.Workspace(f"--quiet -t -i {model}")
    out = np.empty(X.shape[0])
    for i in range(X.shape[0]):
        a, b = X.indptr[i], X.indptr[i + 1]
        feats = " ".join(f"{j + 1}:{v:.7g}" for j, v in zip(X.indices[a:b], X.data[a:b]))
        out[i] = ws.predict(f"| {feats}")
    ws.finish()
    # VW's logistic predict returns the raw margin unless --link logistic is given
    return out


def sklearn_sgd_l1(X, y, alpha: float, passes: int, seed: int = 0):
    from sklearn.linear_model import SGDClassifier

    clf = SGDClassifier(loss="log_loss", penalty="l1", alpha=alpha, max_iter=passes, tol=None, random_state=seed,
                        learning_rate="optimal")
    t0, c0 = time.perf_counter(), time.process_time()
    clf.fit(X, y)
    return clf, time.perf_counter() - t0, time.process_time() - c0
