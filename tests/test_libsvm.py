"""Tokenizer: kernel versus a pure-Python reference parser, awkward syntax, malformed lines."""
import math

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pipeline.formats import libsvm
from pipeline.kernels import colstats
from pipeline.ingest import read_owned_lines


def _beyond_float32(x: float) -> bool:
    with np.errstate(over="ignore"):
        return not np.isfinite(np.float32(x))


def reference_parse(text: str, zero_based=False, width=-1, value_dtype=np.float64):
    """Pure-Python LIBSVM reader: returns (rows, errors) with rows = [(label, [(j, v), ...])]. Labels are
    stored as float32 and values in ``value_dtype``: a finite number those cannot hold is an error."""
    rows, errors = [], []
    base = 0 if zero_based else 1
    for ln, line in enumerate(text.split("\n")):
        line = line.split("#", 1)[0].replace("\r", " ").replace("\t", " ")
        toks = line.split()
        if not toks:
            continue
        try:
            lab = float(toks[0])
            if not math.isfinite(lab):
                raise ValueError
        except ValueError:
            errors.append((ln, libsvm.BAD_LABEL))
            continue
        if _beyond_float32(lab):
            errors.append((ln, libsvm.LABEL_BEYOND_FLOAT32))
            continue
        feats, prev, err = [], -1, None
        for t in toks[1:]:
            if t.startswith("qid:"):
                if not t[4:].isdigit():
                    err = libsvm.BAD_TOKEN
                    break
                continue
            if t.startswith("-"):
                err = libsvm.NEGATIVE_INDEX
                break
            i, _, v = t.partition(":")
            try:
                assert i.isdigit() and _ and len(i) <= 18  # indices above 10**18 are refused
                j, val = int(i) - base, float(v)
            except (AssertionError, ValueError):
                err = libsvm.BAD_TOKEN
                break
            if j < 0:
                err = libsvm.INDEX_ZERO
            elif j == prev:
                err = libsvm.DUPLICATE
            elif j < prev:
                err = libsvm.NON_INCREASING
            elif not math.isfinite(val):
                err = libsvm.NON_FINITE
            elif value_dtype == np.float32 and _beyond_float32(val):
                err = libsvm.VALUE_BEYOND_DTYPE
            elif width >= 0 and j >= width:
                err = libsvm.BEYOND_WIDTH
            if err:
                break
            if value_dtype(val) != 0:  # a zero in the stored dtype (j:0, a float32 underflow) is not stored
                feats.append((j, val))
            prev = j
        if err:
            errors.append((ln, err))
        else:
            rows.append((lab, feats))
    return rows, errors


def to_rows(p):
    return [(float(p.labels[r]), [(int(j), float(v)) for j, v in zip(p.indices[p.indptr[r]:p.indptr[r + 1]],
                                                                      p.data[p.indptr[r]:p.indptr[r + 1]])])
            for r in range(p.n_rows)]


def assert_rows_equal(got, want):
    assert len(got) == len(want)
    for (la, fa), (lb, fb) in zip(got, want):
        assert la == pytest.approx(lb, rel=1e-15, abs=0)
        assert [j for j, _ in fa] == [j for j, _ in fb]
        np.testing.assert_allclose([v for _, v in fa], [v for _, v in fb], rtol=2e-16 * 4, atol=0)


number = st.one_of(
    st.integers(-10**6, 10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr),
    st.floats(min_value=1e-30, max_value=1e30).map(lambda x: f"{x:.6e}"),
    st.floats(min_value=-1e3, max_value=1e3).map(lambda x: f"{x:.9f}"),
    st.sampled_from(["1.", ".5", "-0", "+3", "1E3", "2.5e-3", "0.000001"]),
)
sep = st.sampled_from([" ", "\t", "  ", " \t "])


@st.composite
def libsvm_line(draw):
    label = draw(st.sampled_from(["+1", "-1", "1", "0", "2", "1.5e0", "-0.25"]))
    idx = sorted(draw(st.sets(st.integers(1, 10**9), max_size=8)))
    parts = [label]
    if draw(st.booleans()):
        parts.append(f"qid:{draw(st.integers(0, 99))}")
    parts += [f"{i}:{draw(number)}" for i in idx]
    line = draw(sep).join(parts)
    if draw(st.booleans()):
        line += draw(sep)
    if draw(st.integers(0, 4)) == 0:
        line += " # comment: 3:4 #"
    return line


@st.composite
def libsvm_text(draw):
    lines = draw(st.lists(st.one_of(libsvm_line(), st.sampled_from(["", "   ", "# only a comment", "\t"])),
                          max_size=12))
    nl = draw(st.sampled_from(["\n", "\r\n"]))
    text = nl.join(lines)
    if lines and draw(st.booleans()):
        text += nl
    return text


@settings(max_examples=300, deadline=None)
@given(libsvm_text())
def test_kernel_equals_reference_on_valid_text(text):
    p = libsvm.parse_buffer(text.encode())
    want, errors = reference_parse(text)
    assert errors == [] and p.errors == []
    assert_rows_equal(to_rows(p), want)


@settings(max_examples=300, deadline=None)
@given(libsvm_text(), st.data())
def test_malformed_line_is_reported_with_its_line_and_skipped(text, data):
    lines = text.split("\n")
    bad = data.draw(st.sampled_from(["1 3:x", "1 0:1", "1 5:1 5:2", "1 7:1 3:1", "1 2:nan", "1 2:inf",
                                     "abc 1:1", "1 4:1:2", "1 -3:1", "1 1:", "1 :2", "1 qid:x 1:1",
                                     "1 9:1e999", "nan 1:1", "1 12345678901234567890:1", "1e39 1:1"]))
    at = data.draw(st.integers(0, len(lines)))
    lines.insert(at, bad)
    text = "\n".join(lines)
    want, want_err = reference_parse(text)
    assert len(want_err) == 1 and want_err[0][0] == at
    strict = libsvm.parse_buffer(text.encode())
    assert len(strict.errors) == 1 and strict.errors[0][0] == at and strict.errors[0][2] == want_err[0][1]
    lenient = libsvm.parse_buffer(text.encode(), skip_invalid=True)
    assert [(e[0], e[2]) for e in lenient.errors] == want_err
    assert_rows_equal(to_rows(lenient), want)


def test_awkward_cases_explicitly():
    text = b"+1 qid:3 1:1.5e0\t3:-2E-1 # c 9:9\r\n\n# x\n-1\r\n0 2:.5 4:1.\n2 7:3"
    p = libsvm.parse_buffer(text)
    assert p.errors == []
    assert p.labels.tolist() == [1.0, -1.0, 0.0, 2.0]
    assert p.indptr.tolist() == [0, 2, 2, 4, 5]
    assert p.indices.tolist() == [0, 2, 1, 3, 6]
    assert p.data.tolist() == [1.5, -0.2, 0.5, 1.0, 3.0]
    assert p.row_line.tolist() == [0, 3, 4, 5]
    z = libsvm.parse_buffer(b"1 0:1 4:2\n", zero_based=True)
    assert z.indices.tolist() == [0, 4] and z.max_index == 5


def test_explicit_zeros_are_checked_and_counted_for_the_width_but_not_stored():
    text = b"1 3:0 5:1.5 7:0.0 9:1e-50 10:-0\n-1 2:0\n"
    p = libsvm.parse_buffer(text, value_dtype=np.float32)
    assert p.errors == [] and p.indptr.tolist() == [0, 1, 1] and p.indices.tolist() == [4] and p.max_index == 10
    d = libsvm.parse_buffer(text)  # float64 holds 1e-50
    assert d.indices.tolist() == [4, 8] and d.data.tolist() == pytest.approx([1.5, 1e-50], rel=1e-15)
    for bad, code in ((b"1 3:0 3:1\n", libsvm.DUPLICATE), (b"1 4:0 3:1\n", libsvm.NON_INCREASING),
                      (b"1 11:0\n", libsvm.BEYOND_WIDTH)):
        assert libsvm.parse_buffer(bad, width=10).errors[0][2] == code


def test_width_and_label_pair_checks():
    p = libsvm.parse_buffer(b"1 1:1\n1 11:1\n", width=10)
    assert p.errors[0][0] == 1 and p.errors[0][2] == libsvm.BEYOND_WIDTH
    q = libsvm.parse_buffer(b"1 1:1\n0.5 2:1\n-1 3:1\n", label_pair=(-1, 1), skip_invalid=True)
    assert [(e[0], e[2]) for e in q.errors] == [(1, libsvm.LABEL_NOT_IN_PAIR)] and q.n_rows == 2


@settings(max_examples=200, deadline=None)
@given(text=libsvm_text(), step=st.integers(1, 40))
def test_byte_ranges_own_each_line_exactly_once(text, step):
    import io

    raw = text.encode()
    pieces = []
    with io.BytesIO(raw) as f:
        for start in range(0, max(len(raw), 1), step):
            pieces.append(read_owned_lines(f, start, min(len(raw), start + step), len(raw)).tobytes())
    assert b"".join(pieces) == raw


# ------------------------------------------------------------------ fused column statistics

def numpy_stats(p):
    """Reference statistics of parsed rows: count and float64 sum of squares per feature, in row order
    (np.bincount adds the weights one entry after the other), features ascending."""
    f, inv = np.unique(p.indices.astype(np.int64), return_inverse=True)  # ids up to 1e9: count compactly
    v = p.data.astype(np.float64)
    with np.errstate(over="ignore"):  # 1e200 ** 2 is inf in the kernel too
        ss = np.bincount(inv, weights=v * v, minlength=f.shape[0])
    return f, np.bincount(inv, minlength=f.shape[0]), ss


def assert_stats_exact(got, want, index_dtype):
    gi, gn, gs = got
    wi, wn, ws = want
    assert gi.dtype == np.dtype(index_dtype) and gn.dtype == np.int32 and gs.dtype == np.float64
    assert np.array_equal(gi, wi) and np.array_equal(gn, wn)
    assert np.array_equal(gs.view(np.uint64), ws.view(np.uint64))  # bit for bit


def assert_scratch_zero():
    sc = getattr(colstats._BAND, "scratch", None)
    if sc is not None:
        assert not sc.any() and not colstats._BAND.bits.any()


@settings(max_examples=200, deadline=None)
@given(text=libsvm_text(), bad=st.lists(st.sampled_from(["1 3:x", "1 5:1 5:2", "1 7:1 3:1", "1 2:nan",
                                                         "abc 1:1", "1 -3:1", "1 4:2.5 9:1e999"]),
                                        max_size=3),
       data=st.data())
def test_fused_stats_equal_numpy_reference_in_skip_mode(text, bad, data):
    lines = text.split("\n")
    for b in bad:
        lines.insert(data.draw(st.integers(0, len(lines))), b)
    raw = "\n".join(lines).encode()
    index_dtype = data.draw(st.sampled_from([np.int32, np.int64]))
    value_dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    p = libsvm.parse_buffer(raw, skip_invalid=True, index_dtype=index_dtype, value_dtype=value_dtype,
                            column_stats=True)
    want = numpy_stats(p)
    assert_stats_exact((p.stats_idx, p.stats_nnz, p.stats_sumsq), want, index_dtype)
    # the rows of the reference parser (invalid lines dropped) give the same counts
    rows, _ = reference_parse(raw.decode(), value_dtype=value_dtype)
    cnt = {}
    for _, feats in rows:
        for j, _ in feats:
            cnt[j] = cnt.get(j, 0) + 1
    assert dict(zip(want[0].tolist(), want[1].tolist())) == cnt
    # any band width, the sorted path and the standalone reference agree bit for bit (banded pass on
    # ids // 4096: rows stay sorted, with repeats, and the widths stay small enough for many bands)
    small = p.indices // 4096
    q = libsvm.Parsed(p.indptr, small, p.data, p.labels, p.row_line, [], 0, int(small.max(initial=-1)) + 1)
    want_small = numpy_stats(q)
    for band in (1, 2, 5, 64, 1 << 30):
        assert_stats_exact(colstats.column_stats(q.indptr, q.indices, q.data, q.max_index, band=band),
                           want_small, index_dtype)
    if p.nnz:
        out = [np.empty(p.nnz, d) for d in (index_dtype, np.int32, np.float64)]
        nt = colstats.sorted_sums(p.indices, p.data, *out)
        assert_stats_exact([a[:nt] for a in out], want, index_dtype)
    assert_scratch_zero()


def test_fused_stats_on_many_rows_and_narrow_bands(monkeypatch):
    """Enough rows for the row prefetch, indices far beyond the band (and the default band) width,
    lines that turn invalid after some accepted pairs (skip mode)."""
    rng = np.random.default_rng(7)
    lines = []
    for r in range(400):
        if r % 37 == 5:
            lines.append("1 3:1 8:2 5:1")  # invalid after two pairs: must not count
            continue
        idx = np.unique(rng.integers(1, 3_000_000, rng.integers(0, 60)))
        vals = rng.standard_normal(idx.shape[0]) * 10.0 ** rng.integers(-4, 4, idx.shape[0])
        lines.append(" ".join(["-1"] + [f"{i}:{v:.7g}" for i, v in zip(idx, vals)]))
    raw = ("\n".join(lines) + "\n").encode()
    for index_dtype in (np.int32, np.int64):
        p = libsvm.parse_buffer(raw, skip_invalid=True, index_dtype=index_dtype, value_dtype=np.float32,
                                column_stats=True)
        assert len(p.errors) == 11
        want = numpy_stats(p)
        assert_stats_exact((p.stats_idx, p.stats_nnz, p.stats_sumsq), want, index_dtype)
        for band in (300, 4096, 1 << 16, p.max_index, 10 * p.max_index):
            assert_stats_exact(colstats.column_stats(p.indptr, p.indices, p.data, p.max_index, band=band), want,
                               index_dtype)
        monkeypatch.setattr(colstats, "STATS_BAND", 4096)  # the default path with many bands
        q = libsvm.parse_buffer(raw, skip_invalid=True, index_dtype=index_dtype, value_dtype=np.float32,
                                column_stats=True)
        assert_stats_exact((q.stats_idx, q.stats_nnz, q.stats_sumsq), want, index_dtype)
        monkeypatch.undo()
    assert_scratch_zero()
    colstats.release_scratch()
    assert getattr(colstats._BAND, "scratch", None) is None


def test_fused_stats_edge_cases():
    p = libsvm.parse_buffer(b"1 1:1\n", column_stats=False)
    assert p.stats_idx is None and p.stats_nnz is None and p.stats_sumsq is None
    for raw in (b"", b"# nothing\n", b"1\n-1\n", b"1 3:0 4:-0\n"):
        p = libsvm.parse_buffer(raw, column_stats=True)
        assert_stats_exact((p.stats_idx, p.stats_nnz, p.stats_sumsq), numpy_stats(p), np.int64)
    # very sparse for its width: the sorted path
    p = libsvm.parse_buffer(b"1 5:2 900000000:3\n-1 5:0.5\n", column_stats=True, index_dtype=np.int32)
    assert p.stats_idx.tolist() == [4, 899999999] and p.stats_nnz.tolist() == [2, 1]
    assert p.stats_sumsq.tolist() == [4.25, 9.0] and p.stats_idx.dtype == np.int32
    assert p.stats_nnz.dtype == np.int32 and p.stats_sumsq.dtype == np.float64


# ------------------------------------------------------------------ fast pair path versus the general path

@numba.njit
def _fast_and_general(buf, tok, vpos):
    p = libsvm._base(buf)
    idx, val, te, ok = libsvm._fast_pair(p, tok)
    gval, gend, gok = libsvm._parse_number(p, vpos, buf.shape[0])
    return idx, val, te, ok, gval, gend, gok


digits = st.text("0123456789", max_size=12) | st.text("0", max_size=20) | st.text("0123456789", min_size=15,
                                                                                    max_size=24)


@settings(max_examples=1500, deadline=None)
@given(index=st.integers(0, 10**10), sign=st.sampled_from(["", "-", "+"]), whole=digits, dot=st.booleans(),
       frac=digits, end=st.sampled_from([" ", "\n", "\t", "\r\n", " # c", "#", "x", "e5 ", "\x00"]))
def test_fast_value_path_is_bit_identical_to_the_general_path(index, sign, whole, dot, frac, end):
    value = sign + whole + ("." + frac if dot else "")
    tok = f"{index}:{value}"
    buf = np.frombuffer(("1 " + tok + end + " " * 40).encode(), np.uint8)
    idx, val, te, ok, gval, gend, gok = _fast_and_general(buf, 2, 2 + len(str(index)) + 1)
    frac = frac if dot else ""
    nd = len(whole) + len(frac)
    simple = (len(str(index)) <= 8 and len(whole) <= (7 if sign else 8) and len(frac) <= 16 and 1 <= nd <= 18
              and len(tok) < 24 and end[0] in " \n\t\r")
    assert ok == simple  # the fast path takes exactly the simple shape and leaves the rest alone
    if ok:
        assert gok and idx == index and te == 2 + len(tok) and gend == te
        assert np.float64(val).view(np.uint64) == np.float64(gval).view(np.uint64)
        if len((whole + frac).lstrip("0")) <= 15:  # exact operands: one correctly rounded division
            assert val == float(value) and math.copysign(1.0, val) == math.copysign(1.0, float(value))
    # end to end: the pair near the buffer end (general path only) and followed by padding (fast path)
    line = f"1 {tok}{end}"
    a = libsvm.parse_buffer(line.encode())
    b = libsvm.parse_buffer((line + "\n#" + " " * 40).encode())
    assert a.errors == b.errors
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.data.view(np.uint64), b.data.view(np.uint64))


@settings(max_examples=300, deadline=None)
@given(libsvm_text(), st.lists(st.sampled_from(["1 3:x", "1 0:1", "1 5:1 5:2", "1 7:1 3:1", "1 2:nan", "1 2:-inf",
                                                "1 4:1:2", "1 -3:1", "1 1:", "1 :2", "1 qid:x 1:1", "1 9:1e999",
                                                "1 12345678901234567890:1", "1 2:1.5.5", "1 2:1e", "1 2:0x1",
                                                "1 2:1#c", "1 2:-", "1 2:.", "1 2:+.5 3:-.5e1 4:1E+2"]),
                           max_size=4), st.data())
def test_padded_texts_take_the_fast_path_with_the_same_results(text, bad, data):
    """Padding after the text puts every pair >= _FAST_SPAN bytes before the buffer end (fast path where
    the shape allows): rows and (line, column, code) errors stay those of the unpadded text."""
    lines = text.split("\n")
    for b in bad:
        lines.insert(data.draw(st.integers(0, len(lines))), b)
    text = "\n".join(lines)
    pad = "\n#" + " " * 40
    for skip in (False, True):
        a = libsvm.parse_buffer(text.encode(), skip_invalid=skip)
        b = libsvm.parse_buffer((text + pad).encode(), skip_invalid=skip)
        assert a.errors == b.errors
        assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
        assert np.array_equal(a.data.view(np.uint64), b.data.view(np.uint64))
        assert np.array_equal(a.labels, b.labels) and np.array_equal(a.row_line, b.row_line)
    want, want_err = reference_parse(text + pad)
    assert [(e[0], e[2]) for e in b.errors] == want_err
    assert_rows_equal(to_rows(b), want)


def test_reuse_parses_into_this_threads_buffers():
    """reuse=True gives the same rows and statistics as fresh arrays, in buffers the next reuse parse
    overwrites (ingest writes each block before parsing the next)."""
    from pipeline import arena

    texts = [b"1 1:0.5 7:1\n-1 3:2\n", b"-1 2:0.25 9:3 11:1\n1 4:1\n1 1:2\n"]
    got = []
    for t in texts:
        want = libsvm.parse_buffer(t, column_stats=True, index_dtype=np.int32, value_dtype=np.float32)
        p = libsvm.parse_buffer(t, column_stats=True, index_dtype=np.int32, value_dtype=np.float32, reuse=True)
        for name in ("indptr", "indices", "data", "labels", "row_line", "stats_idx", "stats_nnz", "stats_sumsq"):
            assert np.array_equal(getattr(p, name), getattr(want, name)), name
        got.append(p)
    assert np.shares_memory(got[0].indices, got[1].indices)
    assert np.shares_memory(got[0].stats_sumsq, got[1].stats_sumsq)
    arena.release()


def test_below_mask32_equals_numpy():
    import numba

    from pipeline.kernels.intrinsics import base, below_mask32

    @numba.njit
    def masks(a, c):
        out = np.empty(a.shape[0] - 31, np.uint64)
        for i in range(out.shape[0]):
            out[i] = below_mask32(base(a), i, c)
        return out

    a = np.random.default_rng(1).integers(0, 256, 400).astype(np.uint8)
    a[::7] = 32
    for c in (33, 48, 128, 255):
        want = [int(sum(1 << k for k in range(32) if a[i + k] < c)) for i in range(a.shape[0] - 31)]
        assert masks(a, c).tolist() == want
