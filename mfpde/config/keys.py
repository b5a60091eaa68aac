"""The resolved config as TOML (``DIR/config.toml``), with only the keys the problem uses.

A key is left out when the config makes it irrelevant: the Gaussian data's ``mean``, ``cov``, ``target`` for
``data.kind = "digits"``, ``data.samples`` when ``data.split`` takes all images, ``loss.w`` for a readout that
is not linear, ``training.lambda`` for Tikhonov training, and so on (:func:`in_use`). What is written loads
back to the same problem (the keys left out take their defaults, which the problem does not read).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mfpde.config.schema import _ALIASES_BACK, Config
from mfpde.domains import domain_keys

__all__ = ["in_use", "schema_keys", "to_toml"]


def schema_keys() -> dict[str, Any]:
    """Every config key of the schema (``section.key`` as in TOML) and its default value."""
    out: dict[str, Any] = {}
    cfg = Config()
    for f in (f for f in dataclasses.fields(cfg) if f.name != "source"):
        sec = getattr(cfg, f.name)
        for g in dataclasses.fields(sec):
            out[f"{f.name}.{_ALIASES_BACK.get((f.name, g.name), g.name)}"] = getattr(sec, g.name)
    return out


def in_use(cfg: Config, key: str) -> bool:
    """Whether ``key`` (``section.key``) matters for the problem ``cfg`` describes."""
    t, d, h, da, lo, tr = cfg.tokens, cfg.depth, cfg.heads, cfg.data, cfg.loss, cfg.training
    digits, split = da.kind == "digits", da.kind == "digits" and 0 < da.split < 1
    box, sphere = t.domain == "box", t.domain == "sphere"
    circle = not box  # the keys the circle and the sphere share
    flow = circle and t.solver == "flow"
    rules = {
        "tokens.box": not t.mesh and box, "tokens.cells": not t.mesh and not sphere, "tokens.mesh": bool(t.mesh),
        "tokens.cell": not t.mesh and t.dim == 2 and box, "tokens.attention": circle, "tokens.refine": sphere,
        "tokens.dim": not sphere,
        "data.modes": da.kind in ("circle_modes", "sphere_modes"),
        "data.amplitude": da.kind in ("circle_noise", "sphere_noise"),
        "depth.steps": d.model != "shallow", "depth.layers": d.model == "depth-indexed",
        "depth.scheme": box and d.model != "shallow",
        "tokens.solver": circle, "tokens.labels": flow, "tokens.rtol": flow, "tokens.beta": False,
        "tokens.coupling": False,
        "tokens.noise": (t.domain == "circle" and not flow) or sphere,  # sphere: continuation reads it at any solver
        "tokens.degree": not flow, "tokens.cfl": not flow, "depth.spacing": circle,
        "depth.decades": circle and d.spacing == "log",
        "heads.a": h.family == "value", "heads.box": not h.mesh, "heads.cells": not h.mesh,
        "heads.mesh": bool(h.mesh),
        "data.mean": da.kind == "gaussian", "data.cov": da.kind == "gaussian", "data.target": da.kind == "gaussian",
        "data.classes": digits, "data.samples": digits and not split, "data.test_samples": digits and not split,
        "data.seed": digits or da.kind in ("circle_noise", "sphere_noise"),
        "data.origin": digits, "data.split": digits, "data.path": da.kind == "file",
        "loss.w": lo.readout == "linear", "loss.b": lo.readout == "linear",
        "training.lambda": tr.regularization == "entropic",
        "petsc.token": bool(cfg.petsc.token), "petsc.param": bool(cfg.petsc.param),
        "twin.layers": d.model != "shallow", "twin.lr": cfg.twin.optimizer == "adam",
        # the circle's and the sphere's stationary states only (the hypersphere's are on its Gauss rule, λ's on Θ)
        "continuation.discretisation": t.domain in ("circle", "sphere") and t.noise > 0,
    }
    # [continuation]: for configs `mfpde continuation` can run (noisy tokens off the box; λ of
    # training: no points)
    if not box:
        rules.update(domain_keys(cfg))  # a domain's own keys (:mod:`mfpde.domains`)
    gibbs = box and cfg.continuation.parameter == "lambda" and key != "continuation.points"
    return rules.get(key, not key.startswith("continuation.") or (circle and t.noise > 0) or gibbs)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return repr(v)


def to_toml(cfg: Config, only_in_use: bool = True) -> str:
    """The resolved config as TOML text (loads back with :func:`mfpde.config.from_dict` to the same problem).

    Args:
        cfg: the config.
        only_in_use: leave out the keys that the problem does not use (:func:`in_use`); False: every key.
    """
    lines = []
    for f in (f for f in dataclasses.fields(cfg) if f.name != "source"):
        body = []
        for g in dataclasses.fields(getattr(cfg, f.name)):
            key = _ALIASES_BACK.get((f.name, g.name), g.name)
            if only_in_use and not in_use(cfg, f"{f.name}.{key}"):
                continue
            body.append(f"{key} = {_toml_value(getattr(getattr(cfg, f.name), g.name))}")
        if body or not only_in_use:
            lines += [f"[{f.name}]", *body, ""]
    return "\n".join(lines)


_FOLDED = frozenset({"tokens.beta", "tokens.coupling"})


def unused_given(cfg: Config, given: frozenset[str], aside: list[str], command: str) -> str:
    """The warning line on keys given (``given``: ``section.key``) that the problem or ``command`` does not use.

    Args:
        cfg: the validated config.
        given: the keys the file and the overrides give.
        aside: the messages of the checks :func:`validate` did not apply (keys ``command`` does not read), each
            ``"section.key: why"``; those of keys given are named with why they would be refused.
        command: the CLI command.

    Returns:
        ``""`` when there is nothing to say.
    """
    unused = sorted(k for k in given - _FOLDED if not in_use(cfg, k))
    if command == "continuation" and "tokens.coupling" in given and cfg.tokens.domain != "box":
        unused.append("tokens.coupling (continuation varies K from continuation.start to continuation.stop)")
    bad = [m for m in aside if m.split(":")[0] in given and m.split(":")[0] not in unused]
    parts = []
    if unused:
        parts.append(f"{', '.join(unused)}: not used by this problem (ignored)")
    if bad:
        parts.append(f"not used by `mfpde {command}` (ignored; `mfpde run` would refuse them): {'; '.join(bad)}")
    return "config: " + "; ".join(parts) if parts else ""
