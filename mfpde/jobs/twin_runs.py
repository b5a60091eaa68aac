"""The PDE runs of the ``twin`` job: their configs, and the check that a finished run (``--pde``) is the twin's problem.

The twin compares with an ``mfpde run`` of the same problem (every section but ``[twin]``, ``[output]`` and
``[petsc]``, and the same ``output.every``), and with that run on twice the token cells per axis (the PDE's own
discretisation error, :func:`mfpde.twin.pde.pde_error`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mfpde.config import Config
from mfpde.errors import ConfigError

__all__ = ["pde_config", "reusable", "same_problem"]


#: Sections of a config that do not change the PDE's training (the comparison may differ there; output.every,
#: the steps the two are compared at, is checked on its own).
_NOT_THE_PROBLEM = ("twin", "output", "petsc")
_SECTION_ORDER = ("tokens", "data", "depth", "heads", "loss", "training")


def _shown(table: dict[str, Any], key: str) -> str:
    return repr(table[key]) if key in table else "(not set)"


def same_problem(cfg: Config, pde_dir: Path) -> None:
    """Refuse a finished run whose config is not this one's problem (naming the first key that differs).

    Raises:
        ConfigError: no readable ``config.toml`` in ``pde_dir``, or a key of another value.
    """
    import json
    import tomllib

    from mfpde.config.keys import to_toml

    hint = f" (a twin's output: its PDE run is {str(pde_dir / 'pde')!r})" if (pde_dir / "pde").is_dir() else ""
    try:
        command = json.loads((pde_dir / "report.json").read_text()).get("command")
        theirs = tomllib.loads((pde_dir / "config.toml").read_text())
    except (OSError, ValueError, AttributeError):
        raise ConfigError(f"--pde {str(pde_dir)!r}: not a finished mfpde run (no readable report.json and "
                          f"config.toml){hint}") from None
    if command != "run":
        raise ConfigError(f"--pde {str(pde_dir)!r}: holds the result of `mfpde {command}`, not of `mfpde run`{hint}")
    mine = tomllib.loads(to_toml(cfg))
    first = ("domain", "kind", "model", "family", "dim", "readout")  # the keys that decide what the others mean
    for sec in [*_SECTION_ORDER, *sorted((set(mine) | set(theirs)) - set(_SECTION_ORDER))]:
        if sec in _NOT_THE_PROBLEM:
            continue
        a, b = mine.get(sec, {}), theirs.get(sec, {})
        for key in sorted(set(a) | set(b), key=lambda k: (k not in first, k)):
            if a.get(key) != b.get(key):
                raise ConfigError(f"--pde {str(pde_dir)!r}: {sec}.{key} = {_shown(b, key)} there, {_shown(a, key)} "
                                  "in this config: the twin compares with the PDE of the same problem")
    every = theirs.get("output", {}).get("every")
    if every != cfg.output.every:
        raise ConfigError(f"--pde {str(pde_dir)!r}: output.every = {every!r} there, {cfg.output.every} in this config: "
                          "the twin is compared with the PDE at the PDE's output steps (give the same output.every)")


def pde_config(cfg: Config, refine: bool) -> tuple[Config | None, str]:
    """The config of a PDE run of the twin, and why there is none.

    Fields on (ρ_s at the output steps); with ``refine`` twice the token cells per axis, without plots. Returns
    (None, why) where it cannot be refined (a mesh file).
    """
    import tomllib

    from mfpde.config import from_dict
    from mfpde.config.keys import to_toml

    if refine and cfg.tokens.mesh:
        return None, ("tokens.mesh: a mesh file is not refined here: the PDE's own discretisation error is not "
                      "estimated (no gap is flagged)")
    raw = tomllib.loads(to_toml(cfg))
    raw["output"]["fields"] = True
    if refine:
        raw["tokens"]["cells"] = [2 * c for c in cfg.tokens.cells]
        raw["output"]["plots"] = False
    raw.pop("twin", None)
    return from_dict(raw, source=cfg.source), ""


def reusable(cfg: Config, candidate: Path) -> bool:
    """Whether ``candidate`` holds a finished run of ``cfg`` (the refined PDE beside a ``--pde`` run of a twin)."""
    try:
        same_problem(cfg, candidate)
        return True
    except ConfigError:
        return False
