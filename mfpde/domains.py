"""The token domains (``tokens.domain``): the box, the circle, the sphere and S^{d−1}, each a package with its rules.

A domain other than the box is a package under :mod:`mfpde.tokens` that implements one protocol:

* a ``config`` module: ``KINDS`` (its data kinds), ``check(cfg, reads_data)`` (the rules of its keys; the costly
  ones of the data, such as μ_0's minimum, only where the command reads the data), and optionally
  ``keys(cfg)`` (``{"section.key": used}`` for the keys whose use it decides: the resolved config.toml),
  ``not_applying(cfg)`` (``(section, key, does not apply, why)`` for keys given that it refuses) and
  ``stationary(cfg, points, beta, noise)`` (its problem of stationary states for ``mfpde continuation``, with
  ``POINTS_RULE = (predicate, words)`` on the collocation points), and ``coarser(cfg)`` (the config of the
  resolution check of its cluster counts, :mod:`mfpde.tokens.resolution`);
* a ``job`` module: its part of the ``transport`` job (:func:`mfpde.jobs.transport.domain_transport`):
  ``check(cfg, comm)``, ``describe(cfg)``, ``solve(cfg, comm, fields, bar, **options)``, ``picture(path, cfg,
  block, panels)``, ``summary(cfg, block)``, ``PICTURE`` and optionally ``head(cfg)``.

This module holds what is common: the list of domains, the rules a box applies to the other domains' keys, and the
dispatch. A new domain is one new package and one line in :data:`DOMAINS`.
"""

from __future__ import annotations

import importlib
from typing import Any

from mfpde.errors import ConfigError, ConfigErrors

__all__ = ["DOMAINS", "Found", "check_dirac_heads", "check_domain", "data_kinds", "domain_attribute", "domain_keys",
           "domain_job", "domain_not_applying", "domain_of_kind", "stationary_problem"]

#: The token domains and the package of each (the box lives in :mod:`mfpde.tokens` itself).
DOMAINS = {"box": None, "circle": "mfpde.tokens.circle", "sphere": "mfpde.tokens.sphere",
           "hypersphere": "mfpde.tokens.hypersphere"}


class Found:
    """The config errors a domain's rules found, reported together (one ConfigError, or ConfigErrors for several).

    The checks are independent; one that needs another's key is skipped when that key was wrong.
    """

    def __init__(self) -> None:
        self.messages: list[str] = []

    def need(self, ok: bool, key: str, msg: str) -> bool:
        """Record ``key: msg`` unless ``ok``; return ``ok``."""
        if not ok:
            self.messages.append(f"{key}: {msg}")
        return ok

    def raise_all(self) -> None:
        """Raise what was found, if anything."""
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            raise ConfigErrors(self.messages)


def check_dirac_heads(f: Found, cfg: Any, max_beta: dict[str, float], where: str) -> None:
    """The rules of a domain of Dirac heads of the scalar family (the sphere's, the hypersphere's).

    heads.init Diracs [[β, c], ...] with β in (0, max_beta[attention]], heads.family "scalar" (a is β).
    """
    t, h = cfg.tokens, cfg.heads
    if h.init.get("kind") == "diracs" and t.attention in max_beta:
        betas = [p[0] for p in h.init.get("points", []) if isinstance(p, list | tuple) and p]
        bad = [b for b in betas if isinstance(b, int | float) and not 0 < b <= max_beta[t.attention]]
        f.need(not bad, "tokens.beta", f"β (heads.init's a) must be in (0, {max_beta[t.attention]:g}] with "
               f"{t.attention} attention on the {where}, got {bad}")
    f.need(h.init.get("kind") == "diracs", "heads.init", f"the {where} takes Dirac heads [[β, c], ...] "
           "(tokens.beta = β is the single head (β, 1))")
    f.need(h.family == "scalar", "heads.family", f"the {where} takes the scalar family: a is the inverse "
           "temperature β")


def _config(domain: str) -> Any:
    return importlib.import_module(f"{DOMAINS[domain]}.config")


def domain_keys(cfg: Any) -> dict[str, bool]:
    """The keys whose use the config's domain decides (``{}`` for the box and a domain that decides none)."""
    if DOMAINS.get(cfg.tokens.domain) is None:
        return {}
    keys = getattr(_config(cfg.tokens.domain), "keys", None)
    return dict(keys(cfg)) if keys is not None else {}


def domain_not_applying(cfg: Any) -> list[tuple[str, str, bool, str]]:
    """The domain's rules (section, key, does not apply, why) on keys given that it refuses."""
    if DOMAINS.get(cfg.tokens.domain) is None:
        return []
    rules = getattr(_config(cfg.tokens.domain), "not_applying", None)
    return list(rules(cfg)) if rules is not None else []


def domain_attribute(name: str, attribute: str, default: Any) -> Any:
    """An attribute of a domain's config module (``default`` for the box and a domain without it)."""
    return default if DOMAINS.get(name) is None else getattr(_config(name), attribute, default)


def stationary_problem(cfg: Any, points: int, beta: float, noise: float) -> Any:
    """The domain's discrete stationary problem of noisy tokens (a :class:`mfpde.continuation.Problem`).

    Raises:
        ConfigError: the domain has none (``tokens.domain``), or the points break its rule (``continuation.points``).
    """
    name = cfg.tokens.domain
    mod = _config(name) if DOMAINS.get(name) is not None else None
    make = getattr(mod, "stationary", None)
    if make is None:
        have = [d for d in DOMAINS if DOMAINS[d] is not None and hasattr(_config(d), "stationary")]
        raise ConfigError(f"tokens.domain: continuation needs one of {', '.join(map(repr, have))} (noisy tokens), "
                          f"got {name!r}")
    ok, words = getattr(mod, "POINTS_RULE", (lambda n: True, ""))
    if not ok(points):
        raise ConfigError(f"continuation.points: must be {words}, got {points}")
    return make(cfg, points, beta, noise)


def data_kinds(domain: str) -> tuple[str, ...]:
    """The data kinds of a non-box domain (``()`` for the box, whose kinds :mod:`mfpde.config` checks)."""
    return () if DOMAINS.get(domain) is None else tuple(_config(domain).KINDS)


def domain_of_kind(kind: str) -> str | None:
    """The non-box domain whose data kind ``kind`` is, or None."""
    return next((d for d in DOMAINS if kind in data_kinds(d)), None)


def check_domain(cfg: Any, reads_data: bool = True) -> None:  # a Config: importing it would be a cycle
    """Check ``tokens.domain`` and hand the config to its domain's rules (``reads_data``: the command reads [data]).

    On the box: refuse another domain's data kind, ``tokens.solver`` other than "dg", ``depth.spacing`` other
    than "uniform" and ``tokens.noise``.

    Raises:
        ConfigError: naming the key (:class:`~mfpde.errors.ConfigErrors` for several).
    """
    t, da, d = cfg.tokens, cfg.data, cfg.depth
    if t.domain not in DOMAINS:
        names = ", ".join(repr(n) for n in DOMAINS)
        raise ConfigError(f"tokens.domain: must be one of {names}, got {t.domain!r}")
    if DOMAINS[t.domain] is not None:
        _config(t.domain).check(cfg, reads_data)
        return
    f = Found()
    other = domain_of_kind(da.kind)
    f.need(other is None, "data.kind", f"{da.kind!r} needs tokens.domain = {other!r}")
    off_box = "tokens.domain = 'circle', 'sphere' or 'hypersphere'"
    f.need(t.solver == "dg", "tokens.solver", f"{t.solver!r} needs {off_box} (boxes are solved by DG)")
    f.need(d.spacing == "uniform", "depth.spacing", f"{d.spacing!r} needs {off_box}")
    f.need(t.noise == 0, "tokens.noise", f"{t.noise:g} needs tokens.domain = 'circle', 'sphere' or 'hypersphere' "
           "(noise is not on boxes)")
    f.raise_all()


def domain_job(domain: str) -> Any:
    """The ``job`` module of a domain other than the box: its part of the ``transport`` job (module docstring)."""
    if DOMAINS.get(domain) is None:
        raise ValueError(f"{domain!r} has no job module (the box's transport is mfpde.jobs.transport's own)")
    return importlib.import_module(f"{DOMAINS[domain]}.job")
