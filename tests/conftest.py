"""Shared fixtures: a real 2-worker LocalCluster (loopback) and the shared real data sets."""
from pathlib import Path

import pytest

from pipeline.cluster import local_cluster

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def data_file(rel: str) -> Path:
    """A real LIBSVM file from ../shared/data; its absence is a failure, never a silent skip."""
    p = DATA / rel
    if not p.exists():
        pytest.fail(f"{p} is missing: the tests read the shared data sets from ../shared/data")
    return p


def ingest_shared(tmp_path_factory, client, rel: str, name: str, **options) -> str:
    """Ingest one shared data file into a fresh store (for module-scoped store fixtures)."""
    from pipeline.ingest import IngestOptions, ingest

    out = tmp_path_factory.mktemp(name) / "s.zarr"
    ingest([str(data_file(rel))], str(out), IngestOptions(**options), client=client)
    return str(out)


@pytest.fixture(scope="session")
def client():
    from distributed import Client

    with local_cluster(2, "auto") as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="session")
def one_worker_client():
    """A second real cluster with a single worker, for 1-vs-2-worker determinism tests."""
    from distributed import Client

    with local_cluster(1, "auto") as cluster, Client(cluster) as c:
        yield c


@pytest.fixture
def tmp(tmp_path):
    return tmp_path


def same_model(a, b) -> bool:
    """The same weights (indices and values, bit for bit) and bias."""
    import numpy as np

    return (np.array_equal(a.coef_indices, b.coef_indices) and np.array_equal(a.coef_values, b.coef_values)
            and a.bias == b.bias)
