"""`sparsepipe algorithms [NAME]`: every registered algorithm, its paper and hyper-parameters (from the code)."""
from __future__ import annotations

from typing import Optional

import typer

from cli.app import app, emit_json, fail


@app.command()
def algorithms(name: Optional[str] = typer.Argument(None, help="One algorithm (default: all)."),
               as_json: bool = typer.Option(False, "--json", help="Print JSON.")):
    """Every algorithm `train --algo` takes: a one-line description, its paper, and its hyper-parameters (set
    with `train --set KEY=VALUE`) with type, default, meaning and the ALGORITHMS.md tag of the equation it
    enters. Generated from the registry (pipeline/algorithms/__init__.py) and each algorithm's Params
    dataclass, so a new algorithm appears here without changes to this command."""
    from pipeline.algorithms import ALGORITHMS
    from pipeline.algorithms.describe import describe

    if name is not None and name not in ALGORITHMS:
        fail(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}", 2)
    docs = [describe(n) for n in ([name] if name else ALGORITHMS)]
    if as_json:
        emit_json(docs if name is None else docs[0])
        return
    for i, d in enumerate(docs):
        if i:
            typer.echo("")
        typer.echo(f"{d['name']}: {d['description']}")
        typer.echo(f"  paper: {d['paper'] or '-'}" + (f"  (ALGORITHMS.md {d['section']})" if d["section"] else ""))
        w = max(len(p["name"]) for p in d["params"]) if d["params"] else 0
        tw = max(len(p["type"]) for p in d["params"]) if d["params"] else 0
        dw = max(len(repr(p["default"])) for p in d["params"]) if d["params"] else 0
        for p in d["params"]:
            typer.echo(f"  {p['name']:<{w}}  {p['type']:<{tw}}  {p['default']!r:<{dw}}  [{p['tag']}]  {p['meaning']}")
