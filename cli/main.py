"""`sparsepipe` command line: a thin Typer layer that parses options and calls the pipeline library."""
from cli import (algorithms_cmds, data_cmds, model_cmds, retrain_cmds, sparsify_cmds,  # noqa: F401  (register)
                 stability_cmds, verify_cmds)
from cli.app import app

__all__ = ["app"]

if __name__ == "__main__":  # pragma: no cover
    app()
