"""Tokenizer: kernel versus a pure-Python reference parser, awkward syntax, malformed lines."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pipeline.formats import libsvm
from pipeline.ingest import read_owned_lines


def reference_parse(text: str, zero_based=False, width=-1):
    """Pure-Python LIBSVM reader: returns (rows, errors) with rows = [(label, [(j, v), ...])]."""
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
            elif width >= 0 and j >= width:
                err = libsvm.BEYOND_WIDTH
            if err:
                break
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
                                     "1 9:1e999", "nan 1:1", "1 12345678901234567890:1"]))
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
