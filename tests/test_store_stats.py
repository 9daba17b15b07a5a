"""The commit's sum of per-block feature statistics (sorted sparse lists merged along a fixed tree)."""
import numpy as np
import pytest

from pipeline.store import stats


def random_block(rng, width):
    idx = np.unique(rng.integers(0, width, rng.integers(0, 40)))
    return idx.astype(np.int64), rng.integers(1, 5, idx.shape[0]).astype(np.int64), rng.random(idx.shape[0]) * 10


def numpy_sum(blocks, width):
    cnt, ss = np.zeros(width, np.int64), np.zeros(width)
    for i, c, s in blocks:
        np.add.at(cnt, i, c)
        np.add.at(ss, i, s)
    f = np.flatnonzero(cnt)
    return f, cnt[f], ss[f]


def merge_reference(a, b):
    """Pure-NumPy union of two sorted statistics (the reference for the numba merge)."""
    out = {}
    for i, c, s in zip(*a):
        out[int(i)] = [int(c), float(s)]
    for i, c, s in zip(*b):
        if int(i) in out:
            out[int(i)] = [out[int(i)][0] + int(c), out[int(i)][1] + float(s)]
        else:
            out[int(i)] = [int(c), float(s)]
    keys = sorted(out)
    return np.array(keys, np.int64), np.array([out[k][0] for k in keys]), np.array([out[k][1] for k in keys])


@pytest.mark.parametrize("seed", range(5))
def test_merge_equals_reference_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    a, b = random_block(rng, 60), random_block(rng, 60)
    got, want = stats.merge_stats(*a, *b), merge_reference(a, b)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


@pytest.mark.parametrize("n_blocks", [0, 1, 2, 3, 7, 16, 33])
def test_tree_sum_equals_dense_sums_and_is_fixed_by_block_order(n_blocks):
    rng = np.random.default_rng(n_blocks)
    blocks = [random_block(rng, 200) for _ in range(n_blocks)]
    tree = stats.TreeSum()
    for b in blocks:
        tree.push(b)
    f, c, s = tree.result()
    wf, wc, ws = numpy_sum(blocks, 200)
    assert np.array_equal(f, wf) and np.array_equal(c, wc)
    np.testing.assert_allclose(s, ws, rtol=1e-13)
    again = stats.TreeSum()
    for b in blocks:
        again.push(b)
    assert all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(again.result(), (f, c, s)))
    assert len(tree.stack) == 0 and len(again.stack) == 0
