"""Every shipped config parses, names only known options and builds its algorithm."""
import tomllib
from pathlib import Path

import pytest

from cli.model_cmds import RUN_KEYS
from pipeline.algorithms import make_algorithm

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_is_valid(path):
    cfg = tomllib.loads(path.read_text())["train"]
    hyper = {k: v for k, v in cfg.items() if k not in RUN_KEYS}
    algo = make_algorithm(cfg.get("algo", "tg"), hyper)
    assert algo.name == cfg.get("algo", "tg")


def test_there_are_configs_for_the_shared_sets_and_webspam():
    names = {p.stem for p in CONFIGS}
    assert {"webspam", "rcv1", "dexter", "news20", "svmlight1", "a9a", "w8a"} <= names
