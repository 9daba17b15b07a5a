"""Algorithm registry: name -> (Algorithm class, hyper-parameter dataclass)."""
from pipeline.algorithms.base import params_from_dict


def registry() -> dict:
    from pipeline.algorithms.sgd import SGD, TGParams, TruncatedGradient

    return {"sgd": (SGD, TGParams), "tg": (TruncatedGradient, TGParams)}


def make_algorithm(name: str, options: dict):
    reg = registry()
    if name not in reg:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(sorted(reg))}")
    cls, params_cls = reg[name]
    params = params_from_dict(params_cls, options, where=f"--algo {name}")
    if name == "sgd" and params.gravity != 0:
        raise ValueError("--algo sgd has no gravity; use --algo tg")
    return cls(params)
