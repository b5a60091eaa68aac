"""Splitting schemes for the parameter half of a training step: a registry over one sub-flow interface.

A training step first evaluates the token half at the current ρ_s (every sample forward in depth and its
discrete adjoint backward, giving δR/δρ_s and Φ_s = δR/δρ_s + (λ₂/2)|θ|², theory §4), then advances ρ by
a :class:`Scheme`: a sequence of sub-flows, each run for a fraction of Δs. Sub-flows
(:class:`SubFlow`: ``advance(ds)``):

* ``fokker_planck``: ∂_s ρ = ∇·(ρ∇Φ_s) + λΔρ with Φ_s frozen: one implicit Scharfetter–Gummel step for
  λ > 0 (positive, conservative, frozen-Φ free energy non-increasing for every Δs), the limited MUSCL flux
  with SSP-RK2 in CFL sub-steps for λ = 0 (:class:`mfpde.params.fokker_planck.ParameterFokkerPlanck`,
  :mod:`mfpde.params.muscl`; second order in h_Θ);
* ``ornstein_uhlenbeck``: ∂_s ρ = ∇·(ρ λ₂θ) + λΔρ, the linear part, exact in time
  (:meth:`~mfpde.params.fokker_planck.ParameterFokkerPlanck.exact_step`);
* ``risk_transport``: ∂_s ρ = ∇·(ρ ∇δR/δρ[ρ]), the Wasserstein transport by the risk, by SSP-RK2
  (Heun; Shu & Osher, J. Comput. Phys. 77 (1988) 439–471, the two-stage scheme) of the λ = 0 transport
  steps (limited MUSCL, second order in h_Θ), δR/δρ recomputed (forward + adjoint) at both stages, in
  sub-steps of at most half its CFL limit (positive and conservative). Costs two gradients per sub-step.

Schemes (:data:`SCHEMES`; add one with :func:`register`):

* ``lie`` (first order in Δs): ``fokker_planck``(Δs). The Lie–Trotter splitting of the coupled
  system (H. F. Trotter, Proc. Amer. Math. Soc. 10 (1959) 545–551): token half, then parameter half.
* ``strang`` (second order in Δs): ``ornstein_uhlenbeck``(Δs/2) ``risk_transport``(Δs)
  ``ornstein_uhlenbeck``(Δs/2) (G. Strang, SIAM J. Numer. Anal. 5 (1968) 506–517).

:class:`Splitting` applies a scheme and times each sub-flow (``timings``, and a ``dolfinx.common.Timer``
per sub-flow, so ``dolfinx.common.list_timings`` shows them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from dolfinx.common import Timer

from mfpde.training.state import HeadDensities

__all__ = ["SCHEMES", "FrozenPotentialFlow", "OrnsteinUhlenbeckFlow", "RiskTransportFlow", "Scheme", "Splitting",
           "SubFlow", "register"]


class SubFlow(Protocol):
    """One sub-flow of a splitting scheme: advances every ρ^ℓ in place over a training-time interval."""

    def advance(self, ds: float) -> None:
        """Advance ρ from s to s + ds (collective).

        Raises:
            NumericalError: ρ lost its mass or positivity, or a solve failed.
        """
        ...


@dataclass(frozen=True)
class Scheme:
    """A splitting scheme: the sub-flows in order, each with its fraction of Δs.

    Attributes:
        name: the ``training.splitting`` value; order: the order in Δs; stages: (sub-flow name, fraction of Δs);
        source: the reference.
    """

    name: str
    order: int
    stages: tuple[tuple[str, float], ...]
    source: str


#: The registered schemes by name.
SCHEMES: dict[str, Scheme] = {}


def register(scheme: Scheme) -> Scheme:
    """Add a scheme to :data:`SCHEMES` (its name becomes a valid ``training.splitting``)."""
    SCHEMES[scheme.name] = scheme
    return scheme


register(Scheme("lie", 1, (("fokker_planck", 1.0),), "Trotter, Proc. Amer. Math. Soc. 10 (1959) 545–551"))
register(Scheme("strang", 2, (("ornstein_uhlenbeck", 0.5), ("risk_transport", 1.0), ("ornstein_uhlenbeck", 0.5)),
                "Strang, SIAM J. Numer. Anal. 5 (1968) 506–517"))


class FrozenPotentialFlow:
    """``fokker_planck``: one Fokker–Planck step of every ρ^ℓ with Φ^ℓ (set by the token half) frozen."""

    def __init__(self, state: HeadDensities) -> None:
        self.state = state

    def advance(self, ds: float) -> None:
        """One step of size ds of ∂_s ρ = ∇·(ρ∇Φ) + λΔρ, Φ frozen (theory §4 (FP))."""
        st = self.state
        for k in range(st.n_layers):
            st.check(st.fp.step(st.rhos[k], st.phis[k], ds), "Fokker–Planck step")


class OrnsteinUhlenbeckFlow:
    """``ornstein_uhlenbeck``: ∂_s ρ = ∇·(ρ λ₂θ) + λΔρ, exact in time."""

    def __init__(self, state: HeadDensities) -> None:
        self.state = state

    def advance(self, ds: float) -> None:
        """ρ ← exp(−ds M_L⁻¹L) ρ with the confinement potential (λ₂/2)|θ|²."""
        st = self.state
        for k in range(st.n_layers):
            st.check(st.fp.exact_step(st.rhos[k], st.phi_conf, ds), "Ornstein–Uhlenbeck half-step")


class RiskTransportFlow:
    """``risk_transport``: ∂_s ρ = ∇·(ρ ∇δR/δρ[ρ]) by SSP-RK2 over the λ = 0 (MUSCL) transport steps.

    Args:
        state: the densities.
        risk_potentials: sets ``state.phi_risk`` to δR/δρ at the current ρ (a forward + adjoint pass).
    """

    def __init__(self, state: HeadDensities, risk_potentials: Callable[[], None]) -> None:
        self.state, self.risk_potentials = state, risk_potentials

    def advance(self, ds: float) -> None:
        """SSP-RK2 (Heun) in n = ⌈ds / (CFL/2)⌉ equal sub-steps, δR/δρ recomputed at both stages.

        Each stage is one forward-Euler MUSCL step (``euler_transport``; it sub-steps only if the stage's own
        CFL limit is smaller), so the scheme is SSP-RK2 with the MUSCL flux, of order 2 in Δs and h_Θ.
        """
        st = self.state
        self.risk_potentials()
        cfl = min(st.fp_transport.stability_limit(p) for p in st.phi_risk)
        nsub = 1 if not math.isfinite(cfl) else max(1, math.ceil(ds / (0.5 * cfl)))
        h = ds / nsub
        for j in range(nsub):
            if j > 0:
                self.risk_potentials()
            start = st.values()
            for k in range(st.n_layers):
                st.check(st.fp_transport.euler_transport(st.rhos[k], st.phi_risk[k], h), "transport step")
            self.risk_potentials()
            for k in range(st.n_layers):
                st.check(st.fp_transport.euler_transport(st.rhos[k], st.phi_risk[k], h), "transport step")
                st.rhos[k].x.array[:] = 0.5 * (start[k] + st.rhos[k].x.array)


class Splitting:
    """A scheme applied to named sub-flows, with a timing monitor.

    Args:
        scheme: the scheme, or its name in :data:`SCHEMES`.
        flows: the sub-flows by name (every name the scheme uses).

    Attributes:
        timings: wall seconds spent in each sub-flow so far.

    Raises:
        KeyError: an unknown scheme, or a sub-flow the scheme needs is missing.
    """

    def __init__(self, scheme: Scheme | str, flows: Mapping[str, SubFlow]) -> None:
        self.scheme = SCHEMES[scheme] if isinstance(scheme, str) else scheme
        missing = {name for name, _ in self.scheme.stages} - set(flows)
        if missing:
            raise KeyError(f"scheme {self.scheme.name!r} needs the sub-flows {sorted(missing)}")
        self.flows = flows
        self.timings = {name: 0.0 for name, _ in self.scheme.stages}

    def step(self, ds: float) -> None:
        """One step of size ds: every stage's sub-flow for its fraction of ds, in order."""
        for name, fraction in self.scheme.stages:
            t0 = time.perf_counter()
            with Timer(f"mfpde: {name}"):
                self.flows[name].advance(fraction * ds)
            self.timings[name] += time.perf_counter() - t0
