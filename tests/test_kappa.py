"""Cohen's kappa stability (pipeline.stability), ALGORITHMS.md §2 and §7 property 9."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from sklearn.metrics import cohen_kappa_score

from pipeline.stability import cohen_kappa, mean_pairwise_kappa


def indicator(s, p):
    v = np.zeros(p, dtype=int)
    v[np.asarray(s, dtype=int)] = 1
    return v


def np_kappa(a, b, p):
    """Direct transcription of the §2 formula (floats)."""
    a, b = set(map(int, a)), set(map(int, b))
    p11 = len(a & b)
    p12 = len(a - b)
    p21 = len(b - a)
    p22 = p - p11 - p12 - p21
    qo = (p11 + p22) / p
    qe = ((p11 + p12) * (p11 + p21) + (p12 + p22) * (p21 + p22)) / p**2
    if qe == 1:
        return 1.0 if a == b else 0.0
    return (qo - qe) / (1 - qe)


subsets = st.integers(1, 60).flatmap(
    lambda p: st.tuples(st.just(p), st.sets(st.integers(0, p - 1)), st.sets(st.integers(0, p - 1))))


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(max_examples=150, deadline=None)
@given(subsets)
def test_kappa_equals_sklearn_and_formula(case):
    p, a, b = case
    a, b = np.array(sorted(a), dtype=np.int64), np.array(sorted(b), dtype=np.int64)
    k = cohen_kappa(a, b, p)
    assert -1.0 - 1e-12 <= k <= 1.0 + 1e-12
    assert k == pytest.approx(np_kappa(a, b, p), abs=1e-12)
    assert k == cohen_kappa(b, a, p)  # symmetric, bit for bit
    ref = cohen_kappa_score(indicator(a, p), indicator(b, p), labels=[0, 1],
                            replace_undefined_by=1.0)
    assert k == pytest.approx(ref, abs=1e-12)
    assert cohen_kappa(a, a, p) == 1.0


def test_kappa_by_hand_and_degenerate():
    # p = 10, S1 = {0,1,2,3}, S2 = {2,3,4}: p11=2, p12=2, p21=1, p22=5
    # q_o = 0.7, q_e = (4·3 + 6·7)/100 = 0.54, κ = 0.16/0.46
    assert cohen_kappa([0, 1, 2, 3], [2, 3, 4], 10) == pytest.approx(0.16 / 0.46)
    assert cohen_kappa([], [], 5) == 1.0                       # both empty: q_e = 1, agree
    assert cohen_kappa(range(5), range(5), 5) == 1.0           # both full
    assert cohen_kappa([], range(5), 5) == 0.0                 # empty vs full
    assert cohen_kappa([0], [1], 2) == -1.0                    # complete disagreement
    assert cohen_kappa([3, 1, 1, 3], [1, 3], 8) == 1.0         # unsorted, duplicates
    with pytest.raises(ValueError):
        cohen_kappa([5], [], 5)
    with pytest.raises(ValueError):
        cohen_kappa([], [], 0)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 7), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_mean_pairwise_kappa(B, p, seed):
    rng = np.random.default_rng(seed)
    sets = [np.flatnonzero(rng.random(p) < rng.random()) for _ in range(B)]
    s = mean_pairwise_kappa(sets, p)
    ref = np.mean([cohen_kappa(sets[i], sets[j], p)
                   for i, j in itertools.permutations(range(B), 2)])
    assert s == pytest.approx(ref, abs=1e-12)
    assert -1.0 <= s <= 1.0
    assert mean_pairwise_kappa([sets[0]] * B, p) == 1.0


def test_mean_pairwise_kappa_needs_two_sets():
    with pytest.raises(ValueError):
        mean_pairwise_kappa([[1, 2]], 5)
