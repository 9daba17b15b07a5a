"""What `sparsepipe algorithms` prints: every registered algorithm described from its own code.

Nothing here lists algorithms: a new line in :data:`pipeline.algorithms.ALGORITHMS` appears automatically.
Per algorithm:

* description and paper: the module's optional ``DESCRIPTION`` / ``PAPER`` strings, else its docstring's
  first line — the text before the parenthesis is the description, the parenthesis (without its
  ALGORITHMS.md part) the paper; with no paper there, the heading of the ALGORITHMS.md section it names;
* hyper-parameters: the fields of its Params dataclass — name, type and default from the field; meaning from
  ``field(metadata={"help": ..., "tag": ...})``, else the comment at the end of the field's line (or the
  comment lines just above it), else a shared glossary of common names (``eta``, ``loss``, ...);
* tag: an ALGORITHMS.md equation tag such as ``TG-2`` or ``E-3`` found in the metadata or the comment, else
  the algorithm's ALGORITHMS.md section (``§N``).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import os
import re

from pipeline.algorithms import ALGORITHMS

TAG = re.compile(r"\b([A-Z]{1,3}-\d{1,2})\b")
SECTION = re.compile(r"ALGORITHMS\.md\s*(§\s*\d+)")

GLOSSARY = {
    "loss": "loss function: logistic | hinge | squared",
    "eta": "learning rate (step size) η",
    "schedule": "step schedule: constant | invscaling (eta / t**power_t) | sqrt (power_t = 0.5)",
    "power_t": "exponent of the invscaling schedule",
    "decay": "per-pass multiplier of eta",
    "l2": "L2 penalty (weight decay)",
    "l1": "L1 penalty",
    "lam": "L1 regularisation strength λ",
    "gravity": "truncation gravity g (L1 strength of truncated gradient)",
    "K": "truncate every K steps",
    "theta": "truncation window θ: only weights with |w| ≤ θ are truncated",
    "fit_bias": "learn an unregularised bias term",
    "hinge_at_one": "hinge max(0, 1 - y f): gradient -y at y f <= 1 (the STSGD R code) instead of y f < 1",
    "seed": "seed of the algorithm's own random draws",
    "alpha": "per-coordinate learning-rate scale α",
    "beta": "per-coordinate learning-rate offset β",
    "delta": "failure probability δ",
    "radius": "radius Z of the L1 ball {‖w‖₁ ≤ Z}",
    "gamma": "step parameter γ",
    "eta1": "step size of the first epoch η₁",
    "sparsify_seed": "seed of the sparsification draws",
    "proj_tol": "tolerance of the projection's root finding",
    "rho": "ρ of the RDA regulariser schedule λ_t = λ + γρ/√t",
}


def _field_comments(cls) -> dict:
    """{field: comment} from the dataclass source: the end-of-line comment, its continuation lines, or the
    comment block right above the field."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    out, above, last = {}, [], None
    for ln in lines[1:]:
        s = ln.strip()
        m = re.match(r"(\w+)\s*:\s*[^=]+=.*?(?:#\s*(.*))?$", s)
        if s.startswith("#"):
            if last is not None and ln.index("#") > 8 and not above:  # a continuation of the last comment
                out[last] = (out.get(last, "") + " " + s.lstrip("# ")).strip()
            else:
                above.append(s.lstrip("# "))
            continue
        if m and not s.startswith(("def ", "return", "raise", "if ")):
            out[m.group(1)] = (m.group(2) or " ".join(above)).strip()
            last = m.group(1)
        elif s:
            last = None
        above = []
    return out


def _algorithms_md() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for p in (os.path.join(root, "ALGORITHMS.md"), os.path.join(root, "docs", "ALGORITHMS.md"),
              os.path.join(os.path.dirname(root), "shared", "ALGORITHMS.md")):
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                return f.read()
    return ""


def _section_heading(section: str) -> str:
    num = section.lstrip("§").strip()
    m = re.search(rf"^## {re.escape(num)}\. (.+)$", _algorithms_md(), re.M)
    return m.group(1).strip() if m else ""


def _parentheticals(text: str) -> list:
    """(start, end) of the top-level parentheses of ``text``."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
            if depth == 0:
                out.append((start, i))
    return out


def _type_name(f) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return t


def _default(f):
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        v = f.default_factory()  # type: ignore[misc]
    else:
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def describe(name: str) -> dict:
    """``{name, description, paper, section, class, params: [{name, type, default, meaning, tag}]}``."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(sorted(ALGORITHMS))}")
    mod_name, cls_name, params_name = ALGORITHMS[name]
    mod = importlib.import_module(mod_name)
    params = getattr(mod, params_name)
    doc = (mod.__doc__ or "").strip()
    first = doc.splitlines()[0].strip() if doc else ""
    desc, paper = first, ""
    for a, b in _parentheticals(first):
        inner = first[a + 1:b]
        if "ALGORITHMS.md" in inner or re.search(r"\b(19|20)\d\d\b", inner):
            cite = re.split(r";|ALGORITHMS\.md", inner, maxsplit=1)[0].strip(" ,")
            if " " in cite or "&" in cite:
                paper = cite
            desc = (first[:a].rstrip() + " " + first[b + 1:].lstrip()).strip()
            break
    sec = SECTION.search(first) or SECTION.search(doc)
    section = sec.group(1).replace(" ", "") if sec else ""
    if not paper and section:
        head = _section_heading(section)
        paper = head.split("—", 1)[1].strip() if "—" in head else head
    own = (getattr(mod, cls_name).__dict__.get("__doc__") or "").strip()  # the class's own, e.g. sgd vs tg
    if own:
        desc = own.splitlines()[0]
    desc = getattr(mod, "DESCRIPTION", None) or desc.rstrip(".:").rstrip()
    paper = getattr(mod, "PAPER", None) or paper
    comments = {}
    for base in reversed(params.__mro__):  # inherited fields keep their comments (sgd's are TG's)
        if dataclasses.is_dataclass(base):
            comments.update({k: v for k, v in _field_comments(base).items() if v})
    out = []
    inert = params().inert() if hasattr(params, "inert") else {}  # options the defaults never read
    for f in dataclasses.fields(params):
        meta = dict(f.metadata or {})
        comment = comments.get(f.name, "")
        meaning = meta.get("help") or comment or GLOSSARY.get(f.name, "")
        if f.name in inert:
            meaning = f"{meaning} (no effect at the defaults: {inert[f.name]})"
        tag_m = TAG.search(meta.get("tag", "") or comment)
        out.append({"name": f.name, "type": _type_name(f), "default": _default(f),
                    "meaning": meaning or "(undocumented)",
                    "tag": meta.get("tag") or (tag_m.group(1) if tag_m else section)})
    return {"name": name, "description": desc, "paper": paper, "section": section,
            "class": f"{mod_name}.{cls_name}", "params": out}


def describe_all() -> list[dict]:
    return [describe(n) for n in ALGORITHMS]


def param_names(name: str) -> set:
    """Hyper-parameter names of algorithm ``name``."""
    mod_name, _, params_name = ALGORITHMS[name]
    return {f.name for f in dataclasses.fields(getattr(importlib.import_module(mod_name), params_name))}


def param_types(name: str) -> dict:
    """{hyper-parameter: Python type of its default} (bool, int, float or str)."""
    from pipeline.algorithms import params_class

    return {f.name: type(_default(f)) if not isinstance(f.default, float) else float
            for f in dataclasses.fields(params_class(name))}
