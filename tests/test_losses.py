"""Losses of ALGORITHMS.md §0 (pipeline/kernels/losses.py): derivatives, stability, hinge_at_one."""
import importlib.util
import math
import os
import sys

if importlib.util.find_spec("pipeline") is None:  # allow a plain `pytest` without an installed package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.kernels.losses import HINGE, LOGISTIC, LOSS_CODES, SQUARED, SQUARED_FULL, dloss, loss

LOSSES = [LOGISTIC, HINGE, SQUARED, SQUARED_FULL]


def test_codes():
    assert (LOGISTIC, HINGE, SQUARED) == (0, 1, 2)
    assert LOSS_CODES == {"logistic": 0, "hinge": 1, "squared": 2}


def _central(code, f, y, h=1e-6):
    return (loss(f + h, y, code) - loss(f - h, y, code)) / (2 * h)


@pytest.mark.parametrize("code", LOSSES)
def test_dloss_matches_central_differences_grid(code):
    rng = np.random.default_rng(0)
    fs = rng.uniform(-6, 6, 400)
    ys = rng.choice([-1.0, 1.0], 400) if code != SQUARED else rng.normal(0, 2, 400)
    n = 0
    for f, y in zip(fs, ys):
        if code == HINGE and abs(1.0 - y * f) < 1e-3:
            continue  # kink
        for flag in (False, True):
            assert abs(dloss(f, y, code, flag) - _central(code, f, y)) <= 1e-6
        n += 1
    assert n > 350


@settings(max_examples=300, deadline=None)
@given(code=st.sampled_from(LOSSES), f=st.floats(-10, 10), y=st.sampled_from([-1.0, 1.0]),
       yr=st.floats(-10, 10))
def test_dloss_matches_central_differences_property(code, f, y, yr):
    y = yr if code == SQUARED else y
    if code == HINGE and abs(1.0 - y * f) < 1e-3:
        return
    assert abs(dloss(f, y, code, False) - _central(code, f, y)) <= 1e-6


@pytest.mark.parametrize("y", [-1.0, 1.0])
def test_logistic_values_match_naive_formula(y):
    for f in np.linspace(-20, 20, 81):
        m = y * f
        assert math.isclose(loss(f, y, LOGISTIC), math.log(1 + math.exp(-m)), rel_tol=1e-12, abs_tol=1e-15)
        assert math.isclose(dloss(f, y, LOGISTIC, False), -y / (1 + math.exp(m)), rel_tol=1e-12, abs_tol=1e-15)


@pytest.mark.parametrize("y", [-1.0, 1.0])
def test_logistic_stable_at_large_margin(y):
    # m = y f = +1000: loss ≈ exp(−1000) (underflows to 0), ℓ' ≈ 0
    f = 1000.0 * y
    assert math.isfinite(loss(f, y, LOGISTIC)) and 0.0 <= loss(f, y, LOGISTIC) <= 1e-300
    d = dloss(f, y, LOGISTIC, False)
    assert math.isfinite(d) and abs(d) <= 1e-300
    # m = −1000: loss = 1000 (+ log1p(e^−1000)), ℓ' = −y exactly in double precision
    f = -1000.0 * y
    assert loss(f, y, LOGISTIC) == 1000.0
    assert dloss(f, y, LOGISTIC, False) == -y
    # and across the whole range nothing overflows
    for m in (-1e6, -745.0, -709.0, 0.0, 709.0, 745.0, 1e6):
        assert math.isfinite(loss(m * y, y, LOGISTIC))
        assert math.isfinite(dloss(m * y, y, LOGISTIC, False))
    assert dloss(0.0, y, LOGISTIC, False) == -y / 2


@pytest.mark.parametrize("y", [-1.0, 1.0])
def test_hinge_at_one_flag(y):
    f = y  # margin m = y f = 1 exactly
    assert loss(f, y, HINGE) == 0.0
    assert dloss(f, y, HINGE, False) == 0.0  # y f < 1 rule
    assert dloss(f, y, HINGE, True) == -y    # y f ≤ 1 rule (STSGD R code)
    # away from m = 1 the flag changes nothing
    for m in (-2.0, 0.0, 0.999, 1.001, 3.0):
        assert dloss(m * y, y, HINGE, False) == dloss(m * y, y, HINGE, True) == (-y if m < 1 else 0.0)
        assert loss(m * y, y, HINGE) == max(0.0, 1.0 - m)


def test_squared_half_convention():
    assert loss(3.0, 1.0, SQUARED) == 2.0       # ½ (3 − 1)²
    assert dloss(3.0, 1.0, SQUARED, False) == 2.0
    assert dloss(-0.5, 0.25, SQUARED, True) == -0.75


def test_squared_half_false_is_tgs_squared_loss_twice_the_step(tmp_path):
    """``squared_half = false``: ℓ = (f − y)², ℓ' = 2(f − y) (TG's convention, ALGORITHMS.md §0); with sgd that is
    the ½ loss at twice the step, bit for bit (doubling is exact in floating point), and tg's gravity is not
    doubled with it."""
    from pipeline.ingest import IngestOptions, ingest
    from pipeline.train import fit

    assert loss(3.0, 1.0, SQUARED_FULL) == 4.0 and dloss(3.0, 1.0, SQUARED_FULL, False) == 4.0
    rng = np.random.default_rng(0)
    rows = [f"{rng.normal():.4f} " + " ".join(f"{j}:{rng.normal():.4f}" for j in sorted(rng.choice(40, 6, False) + 1))
            for _ in range(400)]
    (tmp_path / "r.svm").write_text("\n".join(rows) + "\n")
    ingest([str(tmp_path / "r.svm")], str(tmp_path / "r.zarr"), IngestOptions(block_mb=0.005, labels="regression"),
           client=None)
    run = dict(passes=2, paths=1, seed=0, client=None, evaluate=False)
    full = fit(str(tmp_path / "r.zarr"), "sgd", {"loss": "squared", "eta": 0.01, "squared_half": False}, **run)
    half = fit(str(tmp_path / "r.zarr"), "sgd", {"loss": "squared", "eta": 0.02}, **run)
    assert np.array_equal(full.dense_weights(), half.dense_weights()) and full.bias == half.bias
    tg = {"loss": "squared", "gravity": 1e-2, "scale": "none", "bias_adagrad": False}
    a = fit(str(tmp_path / "r.zarr"), "tg", {**tg, "eta": 0.01, "squared_half": False}, **run)
    b = fit(str(tmp_path / "r.zarr"), "tg", {**tg, "eta": 0.02}, **run)
    assert not np.array_equal(a.dense_weights(), b.dense_weights())  # the truncation η·g differs

