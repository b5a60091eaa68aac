"""The configuration: one frozen dataclass tree, loaded from TOML and validated at the door.

Keys and meanings are the contract of ``interface.md`` (section "Config"). Unknown keys, wrong types and
out-of-range values raise :class:`ConfigError`, whose message names the key; the CLI turns it into exit
status 2. ``--set section.key=VALUE`` overrides take TOML value syntax (a bare word is read as a string).
"""

from __future__ import annotations

import copy
import difflib
import logging
import math
import re
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mfpde.config.data import check_data
from mfpde.config.keys import unused_given
from mfpde.config.rules import (
    Problems,
    check_applies,
    check_input_file,
    check_training,
    parse_override,
    parse_size,
    require,
)
from mfpde.config.schema import (
    _ALIASES,
    _ALIASES_BACK,
    _FAMILY_KEYS,
    DEPTH_SCHEMES,
    FAMILY_DEFAULTS,
    Config,
    Data,
    Depth,
    Heads,
    Loss,
    Output,
    Petsc,
    Tokens,
    Training,
)
from mfpde.config.single_head import fold_single_head, later_heads_win
from mfpde.domains import check_domain
from mfpde.errors import ConfigError, ConfigErrors
from mfpde.limits import check_box, check_gaussian_inside, check_integer
from mfpde.limits import check_matrix as _check_matrix

__all__ = ["FAMILY_DEFAULTS", "Config", "ConfigError", "ConfigErrors", "Data", "Depth", "Heads", "Loss", "Output",
           "Petsc", "Problems", "Tokens", "Training", "from_dict", "load", "suggest", "validate"]


logger = logging.getLogger(__name__)

#: Keys whose default NaN means "not set"; a value given must be finite (NaN given is refused: it ran the default
#: heads silently, β of either sign).
UNSET_BY_NAN = frozenset({"tokens.beta", "tokens.coupling"})


def _check_type(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        check_integer(key, value)  # an int beyond float's range (OverflowError in float())
        if not math.isfinite(value):
            leave = " (leave the key out to give heads.init)" if key in UNSET_BY_NAN else ""
            raise ConfigError(f"{key}: must be finite, got {value!r}{leave}")
        return float(value)
    if tp in (int, bool, str):  # a bool is an int to isinstance, but not a config integer
        if isinstance(value, bool) is not (tp is bool) or not isinstance(value, tp):
            raise ConfigError(f"{key}: expected {'an integer' if tp is int else 'a ' + tp.__name__}, got {value!r}")
        return check_integer(key, value) if tp is int else value
    if origin is types.UnionType:  # the first alternative that takes the value (str | int: a size or a word)
        for alt in typing.get_args(tp):
            try:
                return _check_type(key, value, alt)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {' or '.join(a.__name__ for a in typing.get_args(tp))}, got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_check_type(f"{key}[{i}]", v, typing.get_args(tp)[0]) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return dict(value)
    raise TypeError(f"unsupported annotation {tp} for {key}")


def from_dict(raw: dict[str, Any], source: str = "", overridden: frozenset[str] = frozenset(),
              command: str | None = None, warn: Callable[[str], None] | None = None) -> Config:
    """Build and validate a :class:`Config` from a nested dict (parsed TOML).

    ``overridden``: the ``section.key`` given by ``--set`` (:func:`load`): a file's key that an override made
    not apply is not refused (:func:`~mfpde.config.rules.check_applies`). ``command``: the CLI command that
    reads the config ("run", "transport", ...): the keys it does not read are not refused (:func:`validate`),
    and the keys given that it or the problem does not use are named on one warning line (:func:`unused_given`),
    given to ``warn`` (default: logged; the CLI logs it once the input passed the door, so that a refusal is one line).

    Raises:
        ConfigError: an unknown section or key, a wrong type or a value out of range; the message
            names the key.
    """
    hints = typing.get_type_hints(Config)
    sections: dict[str, Any] = {}
    problems = Problems()
    for name, table in raw.items():
        with problems.block():
            if name not in hints or name == "source":
                known = [h for h in hints if h != "source"]
                raise ConfigError(f"unknown config section [{name}]{suggest(name, known, fmt='[{}]')}")
            if not isinstance(table, dict):
                raise ConfigError(f"[{name}] must be a table")
            fhints = typing.get_type_hints(cls := hints[name])
            kwargs = {}
            for key, value in table.items():
                with problems.block(f"{name}.{key}"):  # a key in error is reported and left at its default
                    attr = _ALIASES.get((name, key), key)
                    if attr not in fhints or (name, attr) in _ALIASES_BACK and attr == key:
                        known = [_ALIASES_BACK.get((name, f), f) for f in fhints]
                        raise ConfigError(f"unknown config key {name}.{key}{suggest(key, known, name + '.')}")
                    kwargs[attr] = _check_type(f"{name}.{key}", value, fhints[attr])
            if name == "heads" and not kwargs.get("mesh"):  # family-dependent defaults (deep copies)
                fam = FAMILY_DEFAULTS.get(kwargs.get("family", "scalar"), {})
                kwargs.update({k: copy.deepcopy(v) for k, v in fam.items() if k not in kwargs})
            sections[name] = cls(**kwargs)
    with problems.block("tokens.beta"):  # refused: heads.init is not the head it names, not to be checked further
        fold_single_head(raw, sections)
    cfg = Config(**sections, source=source)
    if problems.clean("data.kind", "data.split", "heads.family", "tokens.domain"):
        with problems.block():
            check_applies(raw, cfg, overridden)
    aside = validate(cfg, problems, command)
    if command is not None:
        given = frozenset(f"{sec}.{key}" for sec, table in raw.items() if isinstance(table, dict) for key in table)
        if overridden & _DECIDING:  # the file's keys that an override made unused are not named: the later word
            given = frozenset(k for k in given if k in overridden)
        line = unused_given(cfg, given, aside, command)
        if line:
            (warn or (lambda text: logger.warning("%s", text)))(line)
    return cfg


#: The keys that decide which others a problem uses (``--set tokens.solver='flow'`` on a DG file: its degree).
_DECIDING = frozenset({"tokens.domain", "tokens.solver", "tokens.mesh", "tokens.noise", "tokens.dim", "depth.model",
                       "depth.spacing", "heads.family", "heads.mesh", "data.kind", "data.split", "loss.readout",
                       "training.regularization", "continuation.parameter", "twin.optimizer"})
def suggest(word: str, known: list[str], prefix: str = "", fmt: str = "{}") -> str:
    """``"; did you mean X?"`` for the closest of ``known`` to a misspelt ``word`` (difflib), or ``""``."""
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f"; did you mean {prefix}{fmt.format(close[0])}?" if close else ""


_require = require


def _check_box(key: str, box: list[list[float]], dim: int) -> None:
    _require(len(box) == dim, key, f"needs {dim} [lo, hi] pairs, got {len(box)}")
    for lo_hi in box:
        _require(len(lo_hi) == 2 and lo_hi[0] < lo_hi[1], key, f"each axis is [lo, hi] with lo < hi, got {lo_hi}")


def heads_dim(h: Heads) -> int:
    """The parameter dimension p of the head family (``scalar``: θ = (a, v), p = 2; ``value``: p = 1)."""
    return {"scalar": 2, "value": 1}[h.family]


def unread_sections(cfg: Config, command: str | None) -> frozenset[str]:
    """The sections ``command`` does not read.

    ``transport``: no [training]; ``continuation`` of noisy tokens: neither [training] nor [data] (its stationary
    states do not depend on μ_0).
    """
    if command == "continuation" and cfg.tokens.domain != "box":
        return frozenset({"training", "data"})
    if command == "transport":
        return frozenset({"training"})
    return frozenset()


def validate(cfg: Config, problems: Problems | None = None, command: str | None = None) -> list[str]:
    """Check ranges and consistency across sections, and report every error found (not only the first).

    Args:
        cfg: the config.
        problems: errors found before (by :func:`from_dict`: unknown keys, wrong types), reported with these.
        command: the CLI command that reads the config (None: check every key); the keys of the sections it does
            not read (:func:`unread_sections`) are checked aside, not refused.

    Returns:
        The messages of the checks aside (keys ``command`` does not read), each naming its key.

    Raises:
        ConfigError: naming the offending key; :class:`~mfpde.errors.ConfigErrors` (a ConfigError) when there
            are several, naming each.
    """
    P = problems if problems is not None else Problems()
    unread = unread_sections(cfg, command)
    A = Problems()  # the checks of keys the command does not read: reported aside (a warning), not refused

    def into(key: str) -> Problems:
        return A if key.split(".")[0] in unread else P

    t, d, h, lo, tr, out = cfg.tokens, cfg.depth, cfg.heads, cfg.loss, cfg.training, cfg.output
    with P.block():
        _require(t.dim in (1, 2) or t.domain != "box", "tokens.dim", f"must be 1 or 2, got {t.dim}")
    dim_ok = t.dim in (1, 2) and P.clean("tokens.dim")  # the box, data, loss.w checked against d only if d is valid
    before = len(P.messages)
    omega = ("tokens.dim", "tokens.box", "tokens.cells", "tokens.mesh", "tokens.domain")
    with P.block():
        if not P.clean(*omega):
            pass
        elif t.mesh:
            check_input_file("tokens.mesh", t.mesh, "a mesh file")
        elif dim_ok and t.domain == "box":  # the circle and the sphere check their own cells (check_domain)
            _check_box("tokens.box", t.box, t.dim)
            _require(len(t.cells) == t.dim and all(c >= 2 for c in t.cells), "tokens.cells",
                     f"needs {t.dim} integers >= 2, got {t.cells}")
            check_box("tokens.box", t.box, t.cells)
    omega_ok = dim_ok and len(P.messages) == before and P.clean(*omega)  # the data against a valid Ω only
    for ok, key, msg in (
        (t.degree in (0, 1) or t.domain != "box", "tokens.degree", f"must be 0 or 1, got {t.degree}"),
        (t.cell in ("quadrilateral", "triangle"), "tokens.cell", "must be 'quadrilateral' or 'triangle'"),
        (0 < t.cfl <= 1, "tokens.cfl", f"must be in (0, 1], got {t.cfl}"),
        (t.outflow_tol >= 0, "tokens.outflow_tol", f"must be >= 0, got {t.outflow_tol}"),
        # the flow solver to 1e10: past the last merge its stiff steps stay near 1e7, the cost grows with T
        (0 < d.T < 1e6 or (t.solver == "flow" and 0 < d.T <= 1e10), "depth.T",
         f"must be in (0, 1e6) (up to 1e10 with tokens.solver = 'flow'), got {d.T:g}"),
        (d.steps >= 1, "depth.steps", f"must be >= 1, got {d.steps}"),
        (d.model in ("weight-tied", "depth-indexed", "shallow"), "depth.model",
         "must be 'weight-tied', 'depth-indexed' or 'shallow'"),
        (d.scheme in DEPTH_SCHEMES, "depth.scheme", f"one of {', '.join(DEPTH_SCHEMES)}, got {d.scheme!r}"),
        (d.layers >= 1 and d.steps % max(d.layers, 1) == 0, "depth.layers",
         f"must be >= 1 and divide depth.steps={d.steps}, got {d.layers}"),
        (h.degree == 1, "heads.degree", "only degree 1 (P1 with mass lumping) is supported"),
    ):
        if P.clean(key, *_DEPENDS.get(key, ())):
            with P.block():
                _require(ok, key, msg)
    if P.clean("heads"):
        with P.block():
            _check_heads(h)
    if P.clean("tokens", "data", "heads.family", "heads.init", "depth", "output.every"):
        with P.block():
            check_domain(cfg, "data" not in unread)  # tokens.domain, and the rules of the circle or the sphere
    if omega_ok and P.clean("data"):
        with into("data").block():
            check_data(cfg)
    for ok, key, msg in (
        (lo.readout in ("mean", "second_moment", "linear"), "loss.readout", "'mean', 'second_moment' or 'linear'"),
        (lo.readout != "linear" or not dim_ok or len(lo.w) == t.dim, "loss.w", f"needs length d={t.dim}"),
        (lo.loss == "squared", "loss.loss", "only 'squared' is supported"),
        (tr.regularization in ("entropic", "tikhonov"), "training.regularization", "'entropic' or 'tikhonov'"),
        (tr.lam >= 0, "training.lambda", f"must be > 0 (entropic) or >= 0 (tikhonov), got {tr.lam:g}"),
        (tr.regularization == "tikhonov" or tr.lam != 0, "training.lambda", "must be > 0 for entropic, got 0"),
        (tr.lambda2 >= 0, "training.lambda2", f"must be >= 0, got {tr.lambda2:g}"),
        (tr.ds > 0, "training.ds", f"must be > 0, got {tr.ds:g}"),
        (tr.steps >= 0, "training.steps", f"must be >= 0, got {tr.steps}"),
        (tr.splitting in ("lie", "strang"), "training.splitting", "must be 'lie' or 'strang'"),
        (out.every >= 1, "output.every", f"must be >= 1, got {out.every}"),
        (out.checkpoint_every >= 1, "output.checkpoint_every", f"must be >= 1, got {out.checkpoint_every}"),
        (out.plots_every >= 0, "output.plots_every", f"must be >= 0 (0: at the end only), got {out.plots_every}"),
    ):
        if P.clean(key, *_DEPENDS.get(key, ())) and A.clean(key, *_DEPENDS.get(key, ())):
            with into(key).block():
                _require(ok, key, msg)
    if P.clean("training.tape_memory"):
        with into("training").block():
            parse_size(tr.tape_memory)
    if not P.messages and not A.messages:  # bounds of λ, λ₂, Δs from Θ, Ω, the readout and the data: all valid
        with into("training").block():
            check_training(cfg)
    P.raise_all()
    return A.messages


#: The keys a check of validate's tables reads besides its own (not checked when one of them was refused).
_DEPENDS = {"tokens.degree": ("tokens.domain",), "depth.T": ("tokens.solver",), "depth.layers": ("depth.steps",),
            "loss.w": ("tokens.dim", "loss.readout"), "training.lambda": ("training.regularization",)}


def _check_heads(h: Heads) -> None:
    """The head family, Θ and ρ₀ (each check depends on the one before: the family fixes p)."""
    _require(h.family in ("scalar", "value"), "heads.family", f"must be 'scalar' or 'value', got {h.family!r}")
    p = heads_dim(h)
    if h.mesh:
        check_input_file("heads.mesh", h.mesh, "a mesh file")
    else:
        _check_box("heads.box", h.box, p)
        _require(len(h.cells) == p and all(c >= 2 for c in h.cells), "heads.cells",
                 f"needs {p} integers >= 2, got {h.cells}")
        check_box("heads.box", h.box, h.cells)
    kind = h.init.get("kind")
    if kind == "gaussian":
        _require(set(h.init) <= {"kind", "mean", "cov"}, "heads.init", "gaussian takes mean and cov")
        mean = _check_type("heads.init.mean", h.init.get("mean"), list[float])
        _require(len(mean) == p, "heads.init.mean", f"needs length {p}")
        _check_matrix("heads.init.cov", _check_type("heads.init.cov", h.init.get("cov", []), list[list[float]]), p)
        if not h.mesh:  # a mesh Θ: checked against its bounding box when ρ₀ is built (params/theta.py)
            check_gaussian_inside("heads.init", mean, h.init["cov"], h.box, "heads.box (Θ)")
    elif kind == "diracs":
        _require(set(h.init) <= {"kind", "points", "weights"}, "heads.init", "diracs take points and weights")
        pts = _check_type("heads.init.points", h.init.get("points", []), list[list[float]])
        w = _check_type("heads.init.weights", h.init.get("weights", []), list[float])
        _require(len(pts) >= 1 and all(len(q) == p for q in pts), "heads.init.points", f"rows of length {p}")
        _require(len(w) == len(pts) and all(x >= 0 for x in w) and sum(w) > 0, "heads.init.weights",
                 "one non-negative weight per point, not all zero")
    else:
        raise ConfigError(f"heads.init.kind: must be 'gaussian' or 'diracs', got {kind!r}")


def load(path: str | Path | None, overrides: list[str] = (), default: str = "run.toml",  # type: ignore[assignment]
         command: str | None = None, warn: Callable[[str], None] | None = None) -> Config:
    """Load a TOML config (or the embedded default ``mfpde/config/defaults/<default>``) and apply overrides.

    ``command``, ``warn``: the CLI command that reads it, and where its warning line goes (:func:`from_dict`).

    Raises:
        ConfigError: the file is missing or not valid TOML, or any key is invalid.
    """
    src, source = ((Path(__file__).parent / "defaults" / default, "<default>") if path is None
                   else (Path(path), str(path)))
    if path is not None:
        check_input_file("config file", src, "a TOML file")
    try:
        raw = tomllib.loads(text := src.read_text(encoding="utf-8-sig"))  # a byte-order mark (Windows) is no error
    except (ValueError, UnicodeDecodeError) as e:  # TOMLDecodeError, an int of > 4300 digits: quote the line
        m = re.search(r"at line (\d+)", str(e)) if isinstance(e, tomllib.TOMLDecodeError) else None
        lines = text.splitlines() if m else []
        at = f": {lines[int(m.group(1)) - 1].strip()[:80]!r}" if m and int(m.group(1)) <= len(lines) else ""
        raise ConfigError(f"{source}: not valid TOML: {str(e).split(';')[0]}{at}") from None
    except RecursionError:
        raise ConfigError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    parsed = [parse_override(item) for item in overrides]
    fam, heads = [v for k, v in parsed if k == ["heads", "family"]], raw.get("heads")
    if fam and isinstance(heads, dict) and fam[-1] != heads.get("family", "scalar"):  # --set changes the family:
        for k in {*_FAMILY_KEYS, "a"} - {ks[-1] for ks, _ in parsed if ks[0] == "heads"}:  # the file's Θ keys (of
            heads.pop(k, None)  # the other p) and a give way to the new family's defaults, unless --set gives them
    later_heads_win(raw, [".".join(k) for k, _ in parsed])
    for item, (keys, value) in zip(overrides, parsed, strict=True):
        table = raw
        for k in keys[:-1]:
            table = table.setdefault(k, {})
            if not isinstance(table, dict):
                raise ConfigError(f"--set {item!r}: {k} is not a table")
        table[keys[-1]] = value
    return from_dict(raw, source=source, overridden=frozenset(".".join(k) for k, _ in parsed), command=command,
                     warn=warn)
