"""Summary of a store for `sparsepipe info`."""
from __future__ import annotations

from pipeline.store import format as fmt
from pipeline.store.reader import open_store


def describe(path: str) -> dict:
    st = open_store(path)
    m = st.manifest
    rows, p, nnz = m["n_rows"], m["n_features"], m["nnz"]
    on_disk = fmt.dir_size(st.path)
    src_bytes = sum(s["size"] for s in m["sources"])
    hold = st.entries("holdout")
    return {
        "store": st.path, "store_id": m["store_id"], "manifest_version": m["manifest_version"],
        "n_rows": rows, "n_features": p, "nnz": nnz,
        "density": nnz / (rows * p) if rows and p else 0.0,
        "nnz_per_row": nnz / rows if rows else 0.0,
        "label_kind": m["labels"]["kind"], "label_counts": m["labels"]["counts"],
        "n_blocks": len(m["blocks"]), "train_blocks": len(m["blocks"]) - len(hold),
        "holdout_blocks": len(hold), "holdout_rows": sum(e["rows"] for e in hold),
        "bytes_on_disk": on_disk, "bytes_source": src_bytes,
        "compression_ratio": src_bytes / on_disk if on_disk else 0.0,
        "skipped_lines": m["skipped"]["count"],
        "sources": [{k: s[k] for k in ("path", "size", "rows", "skipped", "generation", "ingested_at",
                                       "fingerprint", "label_map")} for s in m["sources"]],
        "options": m["options"],
        "feature_order": m.get("feature_order"),
    }
