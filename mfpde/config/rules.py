"""Config rules beyond single values, for :func:`mfpde.config.validate` and :func:`mfpde.config.from_dict`.

* :class:`Problems`: the errors found so far, reported together, and the keys refused (checks that read them
  are skipped: they would quote a default the user never gave).
* :func:`check_input_file`: a file key (``data.path``, ``tokens.mesh``, ``heads.mesh``, the config file) names a
  regular file; a directory, a FIFO, a socket or a device is named as such (opening a FIFO would block).
* :func:`check_training`: ``training.lambda``, ``lambda2`` and ``ds`` within bounds past which the training is
  meaningless or its numbers are not representable (derived in its docstring and in docs/config.md).
* :func:`token_space_fingerprint`: what identifies the token space Ω and its density space (a checkpoint holds
  it, as it holds Θ's points, so that a resume on other token cells is refused).
* :func:`parse_size`: a size in bytes (``training.tape_memory``: ``536870912``, ``"512MiB"``, ``"2GB"``, ``"auto"``).
* :func:`continuation_range_rules`: the ``[continuation]`` range and step control of every continuation.
* :func:`check_applies`: a key given in the config that the problem does not use (``data.samples`` with
  ``data.split``, ``heads.a`` with the scalar family, ``tokens.box`` on the circle) is refused, with why.

Errors are :class:`~mfpde.errors.ConfigError` naming the key (exit status 2).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

from mfpde.config.schema import Training
from mfpde.domains import domain_not_applying
from mfpde.errors import ConfigError, ConfigErrors

__all__ = ["LN_TINY", "MAX_BRANCH_POINTS", "Problems", "ROUNDOFF_DECAY", "UNIFORM_TV", "check_applies",
           "check_input_file", "check_training", "continuation_range_rules", "parse_size", "risk_bound",
           "token_space_fingerprint"]

#: ln of the smallest normal double: e^{−x} underflows (to a subnormal, then 0) for x beyond it.
LN_TINY = -math.log(sys.float_info.min)
#: ln(1/ε): a mode decaying like e^{−γs} is below round-off of its start after s = ROUNDOFF_DECAY/γ.
ROUNDOFF_DECAY = -math.log(sys.float_info.epsilon)
#: Total variation from the uniform density on Θ below which the trained heads are the entropy's, not the data's.
UNIFORM_TV = 0.01
#: The schema's λ and λ₂ (:class:`mfpde.config.schema.Training`), to name the one a refused ratio moved most.
LAMBDA_DEFAULT, LAMBDA2_DEFAULT = Training.lam, Training.lambda2

#: What a path is, by the file-type bits of its ``stat`` (a regular file is what a key wants).
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class Problems:
    """The config errors found so far, to report all of them at once (:class:`~mfpde.errors.ConfigErrors`).

    Each :meth:`block` is a group of checks that stops at its first error (later checks of the group depend
    on it); the groups are independent, so each reports its own. An exception other than ConfigError inside a
    block, after an error was recorded, is a consequence of that error (a value the block could not read) and
    is not reported again; before any, it is a bug and propagates.
    """

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.bad: set[str] = set()  # keys whose value was refused (left at the default: not to be checked further)

    def clean(self, *keys: str) -> bool:
        """Whether none of ``keys`` (``section.key``, or a whole ``section``) holds a value refused before.

        A check reading such a key would quote its default, a value the user never gave.
        """
        return not any(b == k or b.startswith(k + ".") for b in self.bad for k in keys)

    @contextlib.contextmanager
    def block(self, key: str = "") -> typing.Iterator[None]:
        """Run a group of checks; record its ConfigError (every message of a ConfigErrors), and ``key`` as bad."""
        try:
            yield
        except ConfigErrors as e:
            self.messages += e.messages
            self.bad.add(key)
        except ConfigError as e:
            self.messages.append(str(e))
            self.bad.add(key)
        except Exception:
            if not self.messages:
                raise

    def raise_all(self) -> None:
        """Raise the errors recorded: one ConfigError, or :class:`~mfpde.errors.ConfigErrors` for several."""
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            raise ConfigErrors(self.messages)


def check_input_file(key: str, path: str | Path, what: str = "file") -> None:
    """Refuse a path that is missing or not a regular file, saying which (never opens it).

    Args:
        key: the config key (or "config file") named in the message.
        path: the path given.
        what: what the key wants, for the message (e.g. "an .npz file").

    Raises:
        ConfigError: ``"<key>: '<path>' not found"``, or ``"... is a directory, not <what>"`` (FIFO, ...).
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ConfigError(f"{key}: {str(path)!r} not found") from None
    except OSError as e:  # permission denied on a parent, a name too long, a loop of links
        raise ConfigError(f"{key}: {str(path)!r} cannot be read: {e.strerror or e}") from None
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise ConfigError(f"{key}: {str(path)!r} is {kind}, not {what}")


#: The key whose value makes the keys of a section's rule in :func:`check_applies` not apply.
_DECIDED_BY = {"data": "data.split", "heads": "heads.family", "tokens": "tokens.domain", "depth": "depth.model",
               "twin.layers": "depth.model", "twin.lr": "twin.optimizer"}


def check_applies(raw: dict[str, Any], cfg: Any, overridden: frozenset[str] = frozenset()) -> None:  # cfg: a Config
    """Refuse a key given (in ``raw``, the parsed TOML with the overrides) that the problem ``cfg`` does not use.

    Each was dropped without a word: ``data.samples`` and ``data.test_samples`` when ``data.split`` takes every
    image of the pair, ``heads.a`` with the scalar family (whose a is a parameter), ``tokens.box`` and
    ``tokens.cell`` on the circle (whose cells are ``tokens.cells = [n]``), the box keys on the
    sphere. Keys of another data kind, readout or
    regulariser are not refused: ``--set data.kind=...`` on a file is how a file is reused. Nor is a key of the
    file that an override (``overridden``: the ``section.key`` set by ``--set``) made not apply, such as the
    file's ``data.samples`` under ``--set data.split=0.5``: the later word wins.

    Raises:
        ConfigError: naming the key and what makes it not apply (:class:`~mfpde.errors.ConfigErrors` for several).
    """
    t, h, da = cfg.tokens, cfg.heads, cfg.data
    split = da.kind == "digits" and 0 < da.split < 1
    rules = (  # (section, key, does not apply, why); the key deciding it: _DECIDED_BY
        ("data", "samples", split, f"data.split = {da.split:g} takes every image of the pair, that fraction for "
         "training; set data.split = 0 to draw data.samples and data.test_samples"),
        ("data", "test_samples", split, f"data.split = {da.split:g} takes every image of the pair, the rest for "
         "testing; set data.split = 0 to draw data.samples and data.test_samples"),
        ("heads", "a", h.family == "scalar", "the scalar family's a is a parameter (θ = (a, v)); heads.a is the "
         "fixed a of heads.family = 'value'"),
        ("tokens", "box", t.domain == "circle", "the circle has no box (the angle in [0, 2π), its cells "
         "tokens.cells = [n])"),
        ("tokens", "cell", t.domain == "circle", "the circle's cells are intervals of the angle"),
        *(("tokens", k, t.domain == "sphere", "the sphere's mesh is the icosahedron refined tokens.refine times")
          for k in ("box", "cell", "cells", "mesh", "dim")),
        ("tokens", "refine", t.domain != "sphere", "tokens.refine sizes the sphere's mesh (tokens.domain = "
         "'sphere')"),
        ("depth", "scheme", t.domain != "box" or cfg.depth.model == "shallow", "depth.scheme steps the box's deep "
         "models (the shallow model is one layer; the circle and the sphere step by SSP-RK3)"),
        ("twin", "layers", cfg.depth.model == "shallow", "the single layer (depth.model = 'shallow') has no depth to "
         "sweep"),
        *domain_not_applying(cfg),
        ("twin", "lr", cfg.twin.optimizer != "adam", f"twin.lr is Adam's learning rate; twin.optimizer is "
         f"{cfg.twin.optimizer!r}"),
    )
    found = [f"{sec}.{key}: does not apply: {why}" for sec, key, unused, why in rules
             if unused and isinstance(raw.get(sec), dict) and key in raw[sec]
             and not (_DECIDED_BY.get(f"{sec}.{key}", _DECIDED_BY.get(sec)) in overridden
                      and f"{sec}.{key}" not in overridden)]
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        raise ConfigErrors(found)


def _readout_range(cfg: Any) -> tuple[float, float] | None:
    """[min, max] of the readout g over the token box Ω (None for a mesh Ω or the circle)."""
    t, lo = cfg.tokens, cfg.loss
    if t.mesh or t.domain != "box":
        return None
    box = [(float(a), float(b)) for a, b in t.box]
    if lo.readout == "mean":
        return box[0]
    if lo.readout == "second_moment":
        near = sum(0.0 if a <= 0 <= b else min(a * a, b * b) for a, b in box)
        return near, sum(max(a * a, b * b) for a, b in box)
    terms = [(min(w * a, w * b), max(w * a, w * b)) for w, (a, b) in zip(lo.w, box, strict=True)]
    return lo.b + sum(x for x, _ in terms), lo.b + sum(y for _, y in terms)


def risk_bound(cfg: Any) -> float | None:
    """R_max: an upper bound of the risk R(ρ) = mean ½(ŷ_i − y_i)² over every ρ, or None where it is not known.

    ŷ = ∫ g dμ_T with μ_T a measure on Ω of mass at most 1, so ŷ lies between min(0, min_Ω g) and
    max(0, max_Ω g); the targets are ``data.target`` (Gaussian data) or ±1 (digits). Not known for data files,
    the circle or a mesh Ω.
    """
    g = _readout_range(cfg)
    da = cfg.data
    targets = list(da.target) if da.kind == "gaussian" else [-1.0, 1.0] if da.kind == "digits" else None
    if g is None or not targets:
        return None
    lo, hi = min(0.0, g[0]), max(0.0, g[1])
    return max(0.5 * max((lo - y) ** 2, (hi - y) ** 2) for y in targets)


def check_training(cfg: Any) -> None:
    """Refuse λ (``training.lambda``), λ₂ (``lambda2``) and Δs (``ds``) past which training means nothing.

    With Θ a box, osc|θ|² the range of |θ|² over it, h the widest Θ cell, L its diameter and R_max the bound
    of the risk (:func:`risk_bound`):

    * λ ≥ (λ₂/2) osc|θ|² / ln(1/tiny) (entropic): the Gibbs density p_ρ ∝ e^{−Φ/λ} of the potential
      Φ = δR/δρ + (λ₂/2)|θ|² spans e^{−(λ₂/2) osc|θ|²/λ} or less over Θ; beyond the double range (tiny = the
      smallest normal double, ln(1/tiny) ≈ 708) it is 0 on part of Θ and KL(ρ‖p_ρ) is infinite
      (``training.lambda = 1e-308`` ended "ok" with KL 2.4e307). For λ₂ this is the upper bound
      λ₂ ≤ 2 ln(1/tiny) λ / osc|θ|².
    * λ ≤ (R_max + (λ₂/2) osc|θ|²) / (2 δ²), δ = :data:`UNIFORM_TV` (entropic): the free energy's minimiser
      ρ* has F(ρ*) ≤ F(uniform), so λ KL(ρ*‖uniform) ≤ R_max + (λ₂/2) osc|θ|², and by Pinsker's inequality
      ρ* is within total variation δ of the uniform density on Θ: the entropy decides, not the data.
    * λ₂ ≤ 2 R_max / h² (Tikhonov): the minimiser of R + (λ₂/2)∫|θ|²ρ has (λ₂/2)∫|θ|²ρ* ≤ R_max, a second
      moment below one Θ cell: the heads collapse into the cell at θ = 0, which Θ does not resolve.
    * Δs ≤ ln(1/ε) / γ with γ = max(λ₂, π² λ / L²): the linear part ∂_s ρ = ∇·(ρ λ₂ θ) + λ Δρ of the flow on
      a convex Θ has a spectral gap of at least λ₂ (Bakry–Émery) and at least π² λ / L² (Payne–Weinberger); one
      longer step forgets its start to round-off (ε the machine epsilon) and the training time means nothing.

    Θ from a mesh, and R_max where it is not known (data files, the circle), skip the bounds that need them.

    Raises:
        ConfigError: naming the key (:class:`~mfpde.errors.ConfigErrors` for several).
    """
    h, tr = cfg.heads, cfg.training
    if h.mesh:
        return
    box = [(float(a), float(b)) for a, b in h.box]
    osc = sum(max(a * a, b * b) for a, b in box) - sum(0.0 if a <= 0 <= b else min(a * a, b * b) for a, b in box)
    width = max((b - a) / n for (a, b), n in zip(box, h.cells, strict=True))
    diam = math.sqrt(sum((b - a) ** 2 for a, b in box))
    r_max = risk_bound(cfg)
    entropic = tr.regularization == "entropic"
    lam, lam2, found = tr.lam if entropic else 0.0, tr.lambda2, []  # Tikhonov: no entropy, whatever λ says
    conf = 0.5 * lam2 * osc  # the range of the confinement (λ₂/2)|θ|² over Θ
    if entropic and r_max is not None and lam > (top := (r_max + conf) / (2 * UNIFORM_TV**2)):
        found.append(f"training.lambda: λ = {lam:g} > {top:.3g}: the free energy's minimiser would be within total "
                     f"variation {UNIFORM_TV:g} of the uniform density on Θ (the entropy decides, not the data; "
                     f"the risk is at most {r_max:.3g})")
    if entropic and conf / lam > LN_TINY:
        # name the one further (in decades) from its default: the one the user moved
        key, fix = (("training.lambda", "raise training.lambda or lower training.lambda2")
                    if abs(math.log10(lam / LAMBDA_DEFAULT)) >= abs(math.log10(lam2 / LAMBDA2_DEFAULT))
                    else ("training.lambda2", "lower training.lambda2 or raise training.lambda"))
        found.append(f"{key}: (λ₂/2)·osc|θ|² / λ = {conf / lam:.3g} > {LN_TINY:.0f} (λ = {lam:g}, λ₂ = {lam2:g}, "
                     f"|θ|² ranging over {osc:.3g} on heads.box): the Gibbs density e^(−Φ/λ) underflows to 0 on part "
                     f"of Θ and KL(ρ‖p_ρ) is infinite; {fix}")
    if not entropic and r_max is not None and lam2 > (top := 2 * r_max / width**2):
        found.append(f"training.lambda2: λ₂ = {lam2:g} > 2 R_max / h² = {top:.3g}: the minimiser's second moment "
                     f"would be below one Θ cell (h = {width:.3g}; the risk is at most {r_max:.3g}): the heads "
                     "collapse into the cell at θ = 0")
    gap = max(lam2, math.pi**2 * lam / diam**2)  # Δs is checked only against a λ and λ₂ not refused above
    if not found and gap > 0 and tr.ds > (top := ROUNDOFF_DECAY / gap):
        found.append(f"training.ds: Δs = {tr.ds:g} > ln(1/ε)/γ = {top:.3g} (γ = max(λ₂, π²λ/L²) = {gap:.3g}, the "
                     "slowest decay of the confinement and diffusion on Θ): one step forgets its start to round-off")
    if len(found) == 1:
        raise ConfigError(found[0])
    if found:
        raise ConfigErrors(found)


def token_space_fingerprint(cfg: Any) -> str:
    """The token space Ω and its density space as one string (JSON).

    Domain, d, box, cells, cell type, DG degree and the mesh file's SHA-256: the keys that change what a
    checkpoint's ρ was trained against.
    """
    t = cfg.tokens
    mesh = ""
    if t.mesh:
        try:
            mesh = hashlib.sha256(Path(t.mesh).read_bytes()).hexdigest()
        except OSError:  # checked at the door; gone since: the name stands for it
            mesh = str(t.mesh)
    return json.dumps({"domain": t.domain, "dim": t.dim, "box": None if t.mesh else t.box, "cells": t.cells,
                       "cell": t.cell, "degree": t.degree, "mesh": mesh}, sort_keys=True)


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(value: str | int, key: str = "training.tape_memory") -> int | None:
    """Bytes of a size: an integer, or a string such as ``"512MiB"``, ``"2GB"``, ``"1e9"``; None for ``"auto"``.

    Raises:
        ConfigError: naming ``key``: not a size, or not positive.
    """
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(value))
    try:
        n = float(m.group(1)) * _UNITS[m.group(2).lower()] if m else math.nan
    except (ValueError, KeyError):
        n = math.nan
    if not (math.isfinite(n) and n >= 1):
        raise ConfigError(f"{key}: expected a positive size in bytes (e.g. 536870912, \"512MiB\", \"2GB\") or "
                          f"\"auto\", got {value!r}")
    return int(n)


#: The most points a branch may take (``continuation.max_points``).
MAX_BRANCH_POINTS = 100_000


def continuation_range_rules(c: Any, what: str) -> list[tuple[bool, str, str]]:
    """The rules every continuation's ``[continuation]`` range and step control obey: (ok, key, message) each.

    Args:
        c: the ``[continuation]`` section (``start``, ``stop``, ``step``, ``step_min``, ``step_max``,
            ``max_points``).
        what: the parameter's name in the messages ("coupling" with symbol K, or "λ").
    """
    sym = "K" if what == "coupling" else what
    return [
        (math.isfinite(c.start) and c.start > 0, "continuation.start", f"must be a {what} > 0, got {c.start:g}"),
        (math.isfinite(c.stop) and c.stop > 0, "continuation.stop", f"must be a {what} > 0 (the range may not "
         f"cross {sym} = 0), got {c.stop:g}"),
        (c.start != c.stop, "continuation.stop", f"must differ from continuation.start = {c.start:g}"),
        (0 < c.step_min <= c.step <= c.step_max,
         "continuation.step" if 0 < c.step_min <= c.step else "continuation.step_min",
         f"needs 0 < step_min <= step <= step_max, got {c.step_min:g}, {c.step:g}, {c.step_max:g}"),
        (2 <= c.max_points <= MAX_BRANCH_POINTS, "continuation.max_points", f"must be in 2..{MAX_BRANCH_POINTS}"),
    ]


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``section.key=VALUE`` (TOML value syntax; a bare word is a string).

    Raises:
        ConfigError: if there is no ``=`` or the key is not ``section.key``.
    """
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
    key, text = item.split("=", 1)
    path = key.strip().split(".")
    if len(path) < 2:
        raise ConfigError(f"--set {item!r}: KEY must be section.key")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    except ValueError as e:  # an integer of more digits than CPython converts (sys.get_int_max_str_digits)
        raise ConfigError(f"--set {key.strip()}: {str(e).split(';')[0]}") from None
    except RecursionError:
        raise ConfigError(f"--set {key.strip()}: the value is nested too deeply") from None
    return path, value


def require(cond: bool, key: str, msg: str) -> None:
    """Raise :class:`ConfigError` ``key: msg`` unless ``cond``."""
    if not cond:
        raise ConfigError(f"{key}: {msg}")
