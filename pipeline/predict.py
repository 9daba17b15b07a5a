"""Batch prediction from LIBSVM text (streamed in bounded chunks) or from a store, written atomically."""
from __future__ import annotations

import os

import numpy as np

from pipeline.atomic import write_atomically
from pipeline.evaluate import csr_scores

CHUNK = 32 << 20


def _rows_of_text(path: str, zero_based: bool):
    """CSR chunks of the LIBSVM text ``path`` (compressed as `ingest` reads it: .gz .bz2 .xz .zst, URLs)."""
    from pipeline.formats import libsvm  # numba: a store's rows are scored without it
    from pipeline.ingest import _open, compression_of

    line0 = 0
    with _open(path, compression_of(path)) as f:
        for buf in libsvm.line_chunks(f, CHUNK):
            p = libsvm.parse_buffer(buf, zero_based=zero_based)
            if p.errors:
                ln, col, code = p.errors[0]
                raise ValueError(f"{path}:{line0 + ln + 1}:{col}: {libsvm.ERROR_MESSAGES[code]}")
            line0 += p.n_lines
            yield p.indptr, p.indices, p.data


def predict_to_file(model, input_path: str, out_path: str, zero_based: bool = False) -> int:
    """Write 'label score' per row of ``input_path`` (LIBSVM text or store directory); returns the row count."""
    if os.path.isdir(input_path):
        from pipeline.store.order import model_internal
        from pipeline.store.reader import open_store

        st = open_store(input_path)
        model = model_internal(model, st)  # the blocks' ids
        st.expect_reads(st.entries("all"))
        mats = ((b.indptr, b.indices, b.data) for b in st.blocks("all"))
    else:
        from pipeline.ingest import file_size

        if file_size(input_path) == 0:  # a missing or unreadable file: an error naming it
            raise ValueError(f"{input_path}: empty input (0 bytes); nothing to predict")
        mats = _rows_of_text(input_path, zero_based)
    w = model.dense_weights()  # once, not per block; columns beyond the model count 0 (as decision_function)
    regression = model.meta.get("label_kind") == "regression"
    n = 0

    def fill(f):  # nothing half-written: a corrupt block or a bad line leaves no output (pipeline.atomic)
        nonlocal n
        for indptr, indices, data in mats:
            s = csr_scores(indptr, indices, data, w, model.bias)
            lab = s if regression else np.where(s > 0, 1, -1)
            f.write("".join(f"{a:g} {b:.9g}\n" if regression else f"{a:+d} {b:.9g}\n"
                            for a, b in zip(lab, s)).encode())
            n += s.shape[0]

    write_atomically(out_path, fill, durable=False)
    return n
