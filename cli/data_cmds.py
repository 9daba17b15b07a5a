"""Data commands: synth, ingest, reorder, info."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from cli.app import Progress, app, check_output, count, emit_json, fail, run_reporting, user_errors

@app.command()
def ingest(
    inputs: List[str] = typer.Argument(..., help="LIBSVM text files (.gz .bz2 .xz .zst stream through one task); "
                                                  "local paths or fsspec URLs."),
    out: Path = typer.Option(..., "--out", "-o", help="Store directory to create (or extend with --append)."),
    block_mb: float = typer.Option(64.0, min=0.001, help="Target text size of one block / Dask task, in MiB."),
    holdout: float = typer.Option(0.1, min=0.0, max=0.99, help="Fraction of the new blocks held out for evaluation."),
    seed: int = typer.Option(0, help="Seed choosing the holdout blocks."),
    workers: Optional[int] = typer.Option(None, min=1, help="Worker processes of an embedded LocalCluster "
                                                             "(default: threads of this process). Each parses two "
                                                             "blocks at once (or each core, in this process) when the "
                                                             "inputs are larger than a quarter of the memory."),
    scheduler: Optional[str] = typer.Option(None, help="Join an existing Dask scheduler (tcp://host:8786) "
                                                       "instead of starting a local cluster."),
    n_features: Optional[int] = typer.Option(None, min=1, help="Declared width; an index beyond it is an error."),
    zero_based: bool = typer.Option(False, "--zero-based", help="Feature indices start at 0 (default: 1)."),
    on_invalid: str = typer.Option("error", help="'error': stop at the first malformed line, commit nothing; "
                                                 "'skip': drop malformed lines and list them in the store."),
    labels: str = typer.Option("auto", help="auto | regression | -1,1 | 0,1 | 1,2. auto maps a binary "
                                            "encoding to ±1 and keeps other values as regression targets."),
    dtype: str = typer.Option("float32", help="Value dtype in the store: float32 or float64."),
    feature_order: str = typer.Option("auto", "--feature-order", help="auto | frequency | given. frequency "
                                      "numbers the features by how often a 64 MiB sample of the inputs holds them, "
                                      "so that the frequent ones share cache lines in training (a model keeps the "
                                      "inputs' ids); auto does so for uncompressed inputs of 1 GiB or more with "
                                      "over 2^20 features. An append keeps the store's order."),
    append: bool = typer.Option(False, "--append", help="Add the inputs as new blocks of an existing store; "
                                                        "a file already ingested is refused."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
):
    """Turn LIBSVM text into a chunked zarr block store, in parallel and atomically."""
    from pipeline.ingest import IngestOptions, ingest as run_ingest

    try:
        opts = IngestOptions(block_mb=block_mb, holdout=holdout, seed=seed, n_features=n_features,
                             zero_based=zero_based, on_invalid=on_invalid, labels=labels, dtype=dtype,
                             feature_order=feature_order)
    except ValueError as e:
        fail(str(e), 2)
    bar = Progress("ingest", None)

    def progress(done, rows, total):
        if bar.bar is not None:
            bar.bar.update(bar.task, total=total)
        bar.update(done, f"{done / 1e6:,.0f}/{total / 1e6:,.0f} MB  {rows:,} rows")

    summary = run_reporting(bar, lambda: run_ingest(inputs, str(out), opts, append=append, workers=workers,
                                                    scheduler=scheduler, progress=progress))
    for note in summary["notes"]:
        typer.echo(f"note: {note}", err=True)
    share = summary["new_holdout_rows"] / max(1, summary["new_rows"])
    if holdout > 0 and summary["new_rows"] and not holdout / 2 <= share <= 2 * holdout:
        typer.echo(f"note: {summary['new_holdout_rows']:,} of the {summary['new_rows']:,} new rows ({share:.0%}) are "
                   f"held out, against --holdout {holdout:g}: the holdout is whole blocks, here "
                   f"{summary['new_blocks']} of --block-mb {block_mb:g}; a smaller --block-mb splits it finer",
                   err=True)
    if as_json:
        emit_json(summary)
    else:
        typer.echo(f"{summary['store']}: {count(summary['new_rows'], 'row')} added in "
                   f"{count(summary['new_blocks'], 'block')} ({summary['n_rows']:,} rows x {summary['n_features']:,} "
                   f"features, {summary['nnz']:,} non-zeros; {count(summary['holdout_blocks'], 'holdout block')}) in "
                   f"{summary['seconds']:.1f}s, "
                   f"{summary['bytes_read'] / 1e6 / max(summary['seconds'], 1e-9):,.1f} MB/s")
        if summary["skipped_lines"]:
            typer.echo(f"skipped {summary['skipped_lines']} malformed lines, listed in "
                       f"{summary['store']}/{summary['skipped_file']}")


@app.command()
def info(store: Path = typer.Argument(..., help="Store directory."),
         as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Describe a store: rows, features, density, labels, blocks, size on disk, sources."""
    from pipeline.store.info import describe

    try:
        d = describe(str(store))
    except user_errors() as e:
        fail(str(e))
    if as_json:
        emit_json(d)
        return
    typer.echo(f"store        {d['store']}  (id {d['store_id']}, manifest v{d['manifest_version']})")
    typer.echo(f"rows         {d['n_rows']:,}")
    typer.echo(f"features     {d['n_features']:,}")
    typer.echo(f"non-zeros    {d['nnz']:,}  (density {d['density']:.3g}, {d['nnz_per_row']:.1f} per row)")
    lc = ", ".join(f"{k}: {v:,}" for k, v in sorted(d["label_counts"].items()))
    typer.echo(f"labels       {d['label_kind']}  ({lc if len(d['label_counts']) <= 8 else str(len(d['label_counts'])) + ' values'})")
    typer.echo(f"blocks       {d['n_blocks']} ({d['train_blocks']} train, {d['holdout_blocks']} holdout; "
               f"holdout rows {d['holdout_rows']:,})")
    typer.echo(f"size         {d['bytes_on_disk'] / 1e6:,.1f} MB on disk, {d['bytes_source'] / 1e6:,.1f} MB of "
               f"input files as given, compressed or not (ratio {d['compression_ratio']:.2f})")
    typer.echo(f"skipped      {d['skipped_lines']} lines")
    fo = d["feature_order"]
    if not fo:
        typer.echo("order        the input's feature ids")
    else:
        where = ("counted in the training split (`sparsepipe reorder`)" if fo.get("source") == "statistics"
                 else f"seen in a {fo['sample_bytes'] / 2**20:,.1f} MiB sample")
        typer.echo(f"order        features numbered by frequency: the {fo['hot']:,} {where} first (models keep the "
                   f"input's ids)")
    for s in d["sources"]:
        typer.echo(f"source       {s['path']}  ({s['rows']:,} rows, generation {s['generation']}, {s['ingested_at']})")
    o = d["options"]
    typer.echo("options      " + ", ".join(f"{k}={o[k]}" for k in sorted(o) if k != "history"))


@app.command()
def reorder(
    store: Path = typer.Argument(..., help="Store whose features keep the input's ids."),
    out: Path = typer.Option(..., "--out", "-o", help="New store directory for the reordered copy."),
    workers: Optional[int] = typer.Option(None, min=1, help="Worker processes of an embedded LocalCluster "
                                                             "(default: threads of this process)."),
    scheduler: Optional[str] = typer.Option(None, help="Join an existing Dask scheduler (tcp://host:8786)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
):
    """Copy STORE with its features numbered by frequency (the order `ingest --feature-order frequency` writes), for
    faster training at large widths: the store's own counts order them. Rows, labels, holdout and sources stay;
    a model trained on it is the one trained on STORE, bit for bit. STORE is not changed; OUT appears only when
    complete."""
    from pipeline.reorder import reorder as run_reorder

    bar = Progress("reorder", None, "blocks")

    def progress(done, total):
        if bar.bar is not None:
            bar.bar.update(bar.task, total=total)
        bar.update(done, f"{done}/{total} blocks")

    s = run_reporting(bar, lambda: run_reorder(str(store), str(out), workers=workers, scheduler=scheduler,
                                               progress=progress))
    if as_json:
        emit_json(s)
    else:
        typer.echo(f"{s['out']}: {count(s['blocks'], 'block')} of {s['store']} with its {s['hot']:,} features "
                   f"numbered by frequency in {s['seconds']:.1f}s")


@app.command()
def synth(
    out: Path = typer.Argument(..., help="LIBSVM file to write (ground truth goes to OUT.truth.npz/.json)."),
    rows: int = typer.Option(..., min=1, help="Number of rows."),
    features: int = typer.Option(16_609_143, min=1, help="Number of features (webspam trigrams: 16,609,143)."),
    nnz_per_row: int = typer.Option(3700, min=1, help="Mean non-zeros per row (long-tailed spread)."),
    seed: int = typer.Option(0, help="Seed."),
    model_seed: Optional[int] = typer.Option(None, min=0, help="Seed of the concept (w*, bias, feature map; "
                                                               "default: --seed): one model seed with different "
                                                               "seeds gives daily samples of one problem."),
    workers: int = typer.Option(1, min=1, help="Threads generating in parallel (output is identical)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
):
    """Write webspam-like LIBSVM text: Zipf feature frequencies, normalised rows, ~60% positive."""
    from pipeline.synth import synth as run_synth

    check_output(out, "LIBSVM")
    bar = Progress("synth", rows, "rows")
    s = run_reporting(bar, lambda: run_synth(str(out), rows=rows, features=features, nnz_per_row=nnz_per_row,
                                             seed=seed, progress=lambda b, r: bar.update(r, f"{b / 1e6:,.0f} MB"),
                                             workers=workers, model_seed=model_seed))
    if as_json:
        emit_json(s)
    else:
        typer.echo(f"{s['path']}: {s['rows']:,} rows, {s['nnz']:,} non-zeros, {s['bytes'] / 1e6:,.1f} MB "
                   f"in {s['seconds']:.1f}s ({s['mb_per_s']:,.{0 if s['mb_per_s'] >= 10 else 2}f} MB/s)")


