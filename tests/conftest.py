"""Shared fixtures: a real 2-worker LocalCluster (loopback) and the shared real data sets."""
import os
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SHIPPED = Path(__file__).resolve().parents[1] / "tests" / "data"


def data_file(rel: str) -> Path:
    """A real LIBSVM file from ../shared/data (skips when the shared folder is absent)."""
    p = DATA / rel
    if not p.exists():
        pytest.skip(f"{p} not available")
    return p


@pytest.fixture(scope="session")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=40) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture(scope="session")
def one_worker_client():
    """A second real cluster with a single worker, for 1-vs-2-worker determinism tests."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=40) as cluster, Client(cluster) as c:
        yield c


@pytest.fixture
def tmp(tmp_path):
    return tmp_path
