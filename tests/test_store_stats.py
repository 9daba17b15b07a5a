"""The commit's sum of per-block feature statistics in block order: banded over the gathered sets, or a dense
accumulator with a touched bitmap."""
import functools

import numpy as np
import pytest

from pipeline.kernels import colstats
from pipeline.store import stats


def random_block(rng, width, dtypes=(np.int64, np.int64), max_len=40):
    idx = np.unique(rng.integers(0, width, rng.integers(0, max_len)))
    return (idx.astype(dtypes[0]), rng.integers(1, 5, idx.shape[0]).astype(dtypes[1]),
            rng.random(idx.shape[0]) * 10.0 ** rng.integers(-3, 4))


def numpy_sum(blocks, width):
    """Reference: np.add.at block after block (each feature's sum in block order, like the kernel)."""
    cnt, ss = np.zeros(width, np.int64), np.zeros(width)
    for i, c, s in blocks:
        np.add.at(cnt, i, c)
        np.add.at(ss, i, s)
    f = np.flatnonzero(cnt)
    return f, cnt[f], ss[f]


@pytest.mark.parametrize("n_blocks", [0, 1, 2, 7, 33])
@pytest.mark.parametrize("width", [1, 63, 64, 65, 1000])
def test_accumulated_stats_equal_numpy_bit_for_bit_and_scratch_comes_back_zero(n_blocks, width):
    """colstats.band_adds, group after group into one accumulator, then harvest: np.add.at's sums."""
    rng = np.random.default_rng(n_blocks * 1000 + width)
    blocks = [random_block(rng, width, dtypes=((np.int32, np.int32) if k % 2 else (np.int64, np.int64)))
              for k in range(n_blocks)]
    acc, bits = stats.scratch(width)
    for g in range(0, n_blocks, 3):  # groups of up to 3 sets, added one group after another
        group = blocks[g:g + 3]
        ptr = np.cumsum([0] + [b[0].shape[0] for b in group])
        idx, cnt = (np.concatenate([b[k].astype(np.int64) for b in group]) for k in range(2))
        ss = np.concatenate([b[2] for b in group])
        colstats.band_adds(ptr, idx, ss, cnt, width, 1 + g % 70, acc.reshape(-1), bits, np.empty(len(group), np.int64))
    got = stats.harvest(acc, bits)
    want = numpy_sum(blocks, width)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert np.array_equal(got[2].view(np.uint64), want[2].view(np.uint64))
    assert not acc.any() and not bits.any()
    stats.release_scratch()


def test_sparse_statistics_round_trip_and_dense_view(tmp_path):
    rng = np.random.default_rng(3)
    f, c, s = numpy_sum([random_block(rng, 500) for _ in range(5)], 500)
    stats.write_stats(str(tmp_path / "v1"), f, c, s, 500)
    rf, rc, rs = stats.read_stats(str(tmp_path / "v1"))
    assert np.array_equal(rf, f) and np.array_equal(rc, c) and np.array_equal(rs, s)
    nnz, ss = stats.dense_stats(str(tmp_path / "v1"), 600)
    assert nnz.shape == (600,) and np.array_equal(nnz[f], c) and nnz.sum() == c.sum() and np.array_equal(ss[f], s)


@pytest.mark.parametrize("n_blocks", [0, 1, 2, 5])
@pytest.mark.parametrize("width", [400, 1_000_000])
@pytest.mark.parametrize("gather_bytes,group_bytes", [(0, 1 << 26), (0, 16 * 300), (1 << 30, 1 << 26)])
def test_sum_stats_gathers_or_accumulates_bit_identically(n_blocks, width, gather_bytes, group_bytes, monkeypatch):
    """Sets that fit together are concatenated and summed band by band, others added group after group (one
    group, or several of a few sets) into a dense accumulator: both equal the reference bit for bit."""
    stats.release_scratch()
    monkeypatch.setattr(stats, "GATHER_BYTES", gather_bytes)
    monkeypatch.setattr(stats, "GROUP_BYTES", group_bytes)
    rng = np.random.default_rng(n_blocks + width)
    blocks = [random_block(rng, 400, dtypes=(np.int32, np.int32), max_len=400) for _ in range(n_blocks)]
    sizes = [b[0].shape[0] for b in blocks]
    got = stats.sum_stats([lambda out=None, b=b: b for b in blocks], sizes, width)
    want = numpy_sum(blocks, width)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert np.array_equal(np.asarray(got[2]).view(np.uint64), want[2].view(np.uint64))
    dense = sum(sizes) * 16 > max(gather_bytes, 16 * width)
    assert not dense if gather_bytes else (dense or width > 400 or n_blocks < 5)  # both paths are taken
    assert (getattr(stats._SCRATCH, "cols", None) is not None) == dense
    stats.release_scratch()


@pytest.mark.parametrize("seed", range(4))
def test_banded_sum_of_sets_equals_numpy_for_any_band(seed):
    """The commit's kernel (statistics sets as the rows of colstats.band_sums) against np.add.at."""
    rng = np.random.default_rng(seed)
    width = int(rng.integers(1, 3000))
    blocks = [random_block(rng, width, max_len=int(rng.integers(1, 300))) for _ in range(int(rng.integers(1, 12)))]
    ptr = np.cumsum([0] + [b[0].shape[0] for b in blocks])
    idx, cnt, ss = (np.concatenate([b[k] for b in blocks]) for k in range(3))
    want = numpy_sum(blocks, width)
    for band in (None, 1, 2, 63, 64, 100, 1 << 30):
        got = colstats.column_stats(ptr, idx, ss, width, counts=cnt, count_dtype=np.int64, band=band)
        assert all(np.array_equal(np.asarray(g).view(np.uint8), w.view(np.uint8)) for g, w in zip(got, want))
    sc = getattr(colstats._BAND, "scratch", None)
    assert sc is not None and not sc.any() and not colstats._BAND.bits.any()


def test_gathered_counts_widen_beyond_int32():
    """A previous version's counts past 2**31 (a store of > 2**31 rows) keep their exact sum."""
    big = (np.array([2, 5], np.int32), np.array([2**31 + 5, 7], np.int64), np.array([1.0, 2.0]))
    blk = (np.array([5, 9], np.int32), np.array([3, 1], np.int32), np.array([0.5, 0.25]))
    f, c, s = stats.sum_stats([lambda out=None: big, lambda out=None: blk], [2, 2], 10)
    assert f.tolist() == [2, 5, 9] and c.tolist() == [2**31 + 5, 10, 1] and s.tolist() == [1.0, 2.5, 0.25]


def test_sum_of_stored_sets_reads_in_place_and_equals_numpy(tmp_path):
    """Stored block statistics, a format-1 (dense) version and a sparse version with int64 counts, read by
    read_stats into the gathered arrays where the dtypes allow, sum to the np.add.at reference."""
    from pipeline.store import format as fmt

    rng = np.random.default_rng(11)
    width = 5000
    blocks = [random_block(rng, width, dtypes=(np.int32, np.int32), max_len=800) for _ in range(4)]
    groups = []
    for k, (i, c, s) in enumerate(blocks):
        g = str(tmp_path / f"b{k}")
        fmt.make_group(g)
        for name, a in (("stats_idx", i), ("stats_nnz", c), ("stats_sumsq", s)):
            fmt.write_array(g, name, a)
        groups.append(g)
    f1 = str(tmp_path / "v1")  # format 1: dense int64 counts
    fmt.make_group(f1)
    base = numpy_sum(blocks[:2], width)
    dense_nnz, dense_ss = np.zeros(width, np.int64), np.zeros(width)
    dense_nnz[base[0]], dense_ss[base[0]] = base[1], base[2]
    fmt.write_array(f1, "col_nnz", dense_nnz)
    fmt.write_array(f1, "col_sumsq", dense_ss)
    v2 = str(tmp_path / "v2")  # sparse version, int64 counts (written before counts were narrowed)
    fmt.make_group(v2)
    for name, a in (("feature", base[0].astype(np.int32)), ("col_nnz", base[1]), ("col_sumsq", base[2])):
        fmt.write_array(v2, name, a)
    for first in (f1, v2):
        sets = [first] + groups[2:]
        want = numpy_sum(blocks, width)
        got = stats.sum_stats([functools.partial(stats.read_stats, g) for g in sets],
                              [stats.stats_size(g) for g in sets], width)
        assert all(np.array_equal(np.asarray(g).view(np.uint8), w.astype(g.dtype).view(np.uint8))
                   for g, w in zip(got, want))


def test_reused_buffers_give_the_same_sums_and_are_kept_only_when_small(monkeypatch):
    from pipeline import arena

    rng = np.random.default_rng(21)
    blocks = [random_block(rng, 3000, dtypes=(np.int32, np.int32), max_len=500) for _ in range(3)]
    sizes = [b[0].shape[0] for b in blocks]
    loaders = [lambda out=None, b=b: b for b in blocks]
    want = numpy_sum(blocks, 3000)
    arena.release()
    for limit, kept in ((1 << 20, True), (0, False)):
        monkeypatch.setattr(stats, "REUSE_BYTES", limit)
        got = stats.sum_stats(loaders, sizes, 3000, reuse=True)
        assert all(np.array_equal(np.asarray(g).view(np.uint8), w.astype(g.dtype).view(np.uint8))
                   for g, w in zip(got, want))
        assert np.shares_memory(got[2], arena.buffer("colstats.ss", 1, np.float64)) == kept
        arena.release()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("gather_bytes", [1 << 27, 16 * 500, 0])
def test_band_sums_side_by_side_are_the_whole_sum(tmp_path, seed, gather_bytes, monkeypatch):
    """stats.band_sum over the bands of stats.band_edges, read from raw block statistics (memory-mapped) after a
    compressed previous version, concatenated: the np.add.at reference of the whole width, bit for bit; also when
    a band's sets do not fit the gather buffer together and go group after group through the accumulator."""
    from pipeline.store import format as fmt

    monkeypatch.setattr(stats, "GATHER_BYTES", gather_bytes)
    rng = np.random.default_rng(seed)
    width = int(rng.integers(100, 20_000))
    blocks = [random_block(rng, width, dtypes=(np.int32, np.int32), max_len=3000) for _ in range(6)]
    base = str(tmp_path / "v1")
    stats.write_stats(base, *numpy_sum(blocks[:2], width), width)
    groups = [base]
    for k, (i, c, s) in enumerate(blocks[2:]):
        g = str(tmp_path / f"b{k}")
        fmt.make_group(g)
        for name, a in zip(stats.BLOCK_STATS, (i, c, s)):
            fmt.write_array(g, name, a, compress=False)
        assert fmt.raw_map(g, name) is not None
        groups.append(g)
    want = numpy_sum(blocks, width)
    for bands in (1, 2, 3, 7, 50):
        edges = stats.band_edges(blocks[-1][0], width, bands)
        assert edges[0] == 0 and edges[-1] == width and all(np.diff(edges) > 0) and len(edges) - 1 <= bands
        parts = [stats.band_sum(groups, lo, hi) for lo, hi in zip(edges, edges[1:])]
        got = [np.concatenate([p[k] for p in parts]) for k in range(3)]
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert np.array_equal(got[2].view(np.uint64), want[2].view(np.uint64))
