"""The token domains (``tokens.domain``): the box, the circle, the sphere and S^{d−1}, each a package with its rules.

Every domain is a package under :mod:`mfpde.tokens` that implements one protocol:

* a ``config`` module: ``KINDS`` (its data kinds), ``check(cfg, reads_data)`` (the rules of its keys; the costly
  ones of the data, such as μ_0's minimum, only where the command reads the data), ``section(cfg)``: its typed
  section of the config (a frozen dataclass of what its job and solvers read: its keys of ``[tokens]`` and
  ``[data]``, its heads, and the ``depth`` and ``output`` sections; the box's, whole sections), built once by the
  jobs floor (:func:`domain_section`), and optionally ``keys(cfg)`` (``{"section.key": used}`` for the keys whose
  use it decides: the resolved config.toml), ``not_applying(cfg)`` (``(section, key, does not apply, why)`` for
  keys given that it refuses), ``stationary(cfg, points, beta, noise)`` (its problem of stationary states for
  ``mfpde continuation``, with ``POINTS_RULE = (predicate, words)`` on the collocation points) and
  ``coarser(sec)`` (the section of the resolution check of its cluster counts, :mod:`mfpde.tokens.resolution`);
  the job's functions and ``coarser`` take the section, never the whole config;
* a ``job`` module: its part of the ``transport`` job (:func:`mfpde.jobs.transport.domain_transport`), each
  function taking the domain's section ``sec``:
  ``check(sec, comm)``, ``describe(sec)``, ``solve(sec, comm, fields, bar, **options)`` (``fields``: the job's
  :class:`~mfpde.fields.FieldFiles`, or None; the domain names its fields, never a path), ``picture(sec, block,
  panels)`` (the figure, or None: the job saves it), ``PICTURE``, and optionally ``SAVEFIG`` (matplotlib's options
  for the picture), ``summary(sec, block)`` (the last log line) and ``head(sec)``.
  ``solve`` returns (the sample block, the picture's panels), or (a list of sample blocks, the panels) where the
  domain transports many samples (the box: train and test); a :class:`~mfpde.errors.NumericalError` carries the
  failed sample's partial ``block``, or in ``blocks`` the blocks of the samples done before it. ``check`` may
  return the domain's set-up (the box: its built :class:`~mfpde.tokens.box.problem.Problem`), which ``describe`` and
  ``solve`` then receive as keyword ``setup``. ``NAMED = False``: the report's head has no ``domain`` field;
  ``PROGRESS = False``: no progress display of the output depths (the box: a log line per sample). A domain
  without ``coarser`` has no resolution check: its blocks have no ``resolution_check`` and its report no
  ``warnings``.

This module holds what is common: the list of domains, the rules of Dirac heads the sphere and the hypersphere
share, and the dispatch. A new domain is one new package and one line in :data:`DOMAINS`.
"""

from __future__ import annotations

import importlib
from typing import Any

from mfpde.errors import ConfigError, ConfigErrors

__all__ = ["DOMAINS", "Found", "check_dirac_heads", "check_domain", "data_kinds", "domain_attribute", "domain_keys",
           "domain_job", "domain_not_applying", "domain_section", "domain_of_kind", "stationary_problem"]

#: The token domains and the package of each.
DOMAINS = {"box": "mfpde.tokens.box", "circle": "mfpde.tokens.circle", "sphere": "mfpde.tokens.sphere",
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
    """The keys whose use the config's domain decides (``{}`` for a domain that decides none, or no domain)."""
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
    """An attribute of a domain's config module (``default`` for a domain without it, or no domain)."""
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
        have = [d for d in DOMAINS if hasattr(_config(d), "stationary")]
        raise ConfigError(f"tokens.domain: continuation needs one of {', '.join(map(repr, have))} (noisy tokens), "
                          f"got {name!r}")
    ok, words = getattr(mod, "POINTS_RULE", (lambda n: True, ""))
    if not ok(points):
        raise ConfigError(f"continuation.points: must be {words}, got {points}")
    return make(cfg, points, beta, noise)


def data_kinds(domain: str) -> tuple[str, ...]:
    """The data kinds of a domain (``()`` for a name that is none)."""
    return () if DOMAINS.get(domain) is None else tuple(_config(domain).KINDS)


def domain_of_kind(kind: str) -> str | None:
    """The domain whose data kind ``kind`` is, or None."""
    return next((d for d in DOMAINS if kind in data_kinds(d)), None)


def check_domain(cfg: Any, reads_data: bool = True) -> None:  # a Config: importing it would be a cycle
    """Check ``tokens.domain`` and hand the config to its domain's rules (``reads_data``: the command reads [data]).

    Raises:
        ConfigError: naming the key (:class:`~mfpde.errors.ConfigErrors` for several).
    """
    domain = cfg.tokens.domain
    if domain not in DOMAINS:
        names = ", ".join(repr(n) for n in DOMAINS)
        raise ConfigError(f"tokens.domain: must be one of {names}, got {domain!r}")
    _config(domain).check(cfg, reads_data)


def domain_section(cfg: Any) -> Any:
    """The domain's typed section of ``cfg`` (its ``section``): what its job reads."""
    return domain_attribute(cfg.tokens.domain, "section", None)(cfg)


def domain_job(domain: str) -> Any:
    """The ``job`` module of a domain: its part of the ``transport`` job (module docstring)."""
    if DOMAINS.get(domain) is None:
        raise ValueError(f"{domain!r} is not a token domain (one of {', '.join(map(repr, DOMAINS))})")
    return importlib.import_module(f"{DOMAINS[domain]}.job")
