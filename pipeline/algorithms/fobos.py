"""FOBOS with ℓ1 (Duchi & Singer 2009; the STSGD paper's baseline, ALGORITHMS.md §2 "what was measured").

    w_{t+½} = w_t − η_t·ℓ'(w_t·x_t, y_t)·x_t ,   w_{t+1} = S(w_{t+½}, η_t·λ) ,   η_t = η/√t (default η = 1)

This is exactly truncated gradient with K = 1, θ = ∞ and gravity λ (TG-1/TG-2 with η_{t+½} = η_t), so it
reuses TG's lazy kernel (pipeline.kernels.sgd) and its parameter mixing; only the parameterisation differs.
Like TG's, the defaults [R] read ``eta`` in units of 1/E‖x‖² and ``lam`` in units of rms(x) (``scale = "data"``,
the resolved values are in the model's ``hyper.resolved``) and give the bias AdaGrad steps; ``scale = "none"`` and
``bias_adagrad = false`` are the literal update above.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from pipeline.algorithms.sgd import TGParams, TruncatedGradient


@dataclass(frozen=True)
class FOBOSParams:
    loss: str = "logistic"
    eta: float = 1.0
    lam: float = 1e-3               # STSGD grid {5e-5, ..., 10}
    schedule: str = "sqrt"          # sqrt (η/√t, the paper's) | constant | invscaling
    power_t: float = 0.5
    scale: str = "data"             # "data": eta in units of 1/E‖x‖², lam × rms(x) (as TG's); "none": literal
    bias_adagrad: bool = True       # AdaGrad step for the bias alone (as TG's); false: the plain step η_t
    fit_bias: bool = True
    hinge_at_one: bool = False

    def __post_init__(self):
        self.tg()  # validates through TGParams (messages name the option)

    def tg(self) -> TGParams:
        return TGParams(loss=self.loss, eta=self.eta, schedule=self.schedule, power_t=self.power_t,
                        gravity=self.lam, K=1, theta=math.inf, scale=self.scale, bias_adagrad=self.bias_adagrad,
                        fit_bias=self.fit_bias, hinge_at_one=self.hinge_at_one)


class FOBOS(TruncatedGradient):
    name = "fobos"
    Params = FOBOSParams

    def __init__(self, params: FOBOSParams):
        super().__init__(params.tg())
        self.fobos_params = params

    def hyper(self):
        h = dataclasses.asdict(self.fobos_params)
        if self.fobos_params.scale == "data":
            h["resolved"] = {"eta": self.eta, "lam": self.gravity}
        return h
