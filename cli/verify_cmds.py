"""`sparsepipe verify`: every block against the manifest, the manifest's totals and the feature statistics."""
from __future__ import annotations

from pathlib import Path

import typer

from cli.app import EXIT_CORRUPT, Progress, app, emit_json, fail, user_errors


@app.command()
def verify(store: Path = typer.Argument(..., help="Store directory."),
           as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")):
    """Read every block of STORE: checksum, lengths, row pointers, indices and labels against the manifest; the
    manifest's totals; the training split's feature statistics against a recount. Lists every bad block.
    Exit code 0: all good; 5: any problem (the store is corrupt: re-ingest the named sources or restore it)."""
    from pipeline.store.verify import verify_store

    bar = Progress("verify", None, "blocks")

    def progress(done, total):
        if bar.bar is not None:
            bar.bar.update(bar.task, total=total)
        bar.update(done, f"{done}/{total} blocks")

    try:
        rep = verify_store(str(store), progress)
    except user_errors() as e:
        fail(str(e))
    finally:
        bar.close()
    if as_json:
        emit_json(rep)
    else:
        for b in rep["bad_blocks"]:
            where = (f"bytes {b['byte_range'][0]}-{b['byte_range'][1]} of {b['source']}" if b["byte_range"]
                     else f"{b['source']} from line {b['first_line']}")
            typer.echo(f"bad block {b['key']} ({b['split']}, {where}): {'; '.join(b['problems'])}")
        for p in rep["problems"]:
            typer.echo(f"problem: {p}")
        if rep["ok"]:
            typer.echo(f"{rep['store']}: OK, {rep['blocks']} blocks, {rep['rows']:,} rows verified"
                       f"{' (feature statistics recounted)' if rep['stats_checked'] else ''} in {rep['seconds']:.1f}s")
    if not rep["ok"]:
        typer.echo(f"error: {rep['store']}: {len(rep['bad_blocks'])} bad block(s), {len(rep['problems'])} other "
                   f"problem(s); re-ingest the named sources or restore the store from a copy", err=True)
        raise typer.Exit(EXIT_CORRUPT)
