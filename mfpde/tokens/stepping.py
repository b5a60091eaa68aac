"""What the depth loops of the token solvers share: step control, the checks after a depth step, the moments.

Used by the per-sample solver (:class:`~mfpde.tokens.box.transport.TokenTransport`) and the batched one
(:class:`~mfpde.tokens.box.batch.BatchTransport`), so both stop on the same conditions with the same messages
(theory §1.3: mass balance with the outflow; interface: exit status 3). Non-dimensional.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from mfpde.errors import InputRefused, NumericalError
from mfpde.tokens.box.readout import Readout

__all__ = ["MAX_SUBSTEPS", "StepTooLong", "at_depth_step", "batch_moments", "cfl_step", "check_depth_step",
           "first_step_error", "quadrature_moments", "substeps_error"]

Array = npt.NDArray[np.float64]

#: Sub-steps of one depth step beyond which the CFL doubling gives up (a velocity blow-up).
MAX_SUBSTEPS = 2**16


def quadrature_moments(wts: Array, x: Array, g: Readout | None = None) -> tuple[float, Array, Array, float]:
    """Mass, mean (d,), covariance (d, d) and ∫ g dμ of μ = Σ_i w_i δ_{x_i} (the lumped quadrature of μ_h).

    Args:
        wts: quadrature weights m_i μ_i, shape (N,), non-negative with a positive sum.
        x: the nodes, shape (N, d).
        g: readout; None gives NaN for ∫ g dμ.

    Moments are of the normalised measure μ/∫μ; ∫ g dμ is not normalised (theory §2: ŷ = ∫ g dμ_T).
    """
    mass, mean, cov, yhat = batch_moments(wts[None], x, g(x) if g is not None else None)
    return float(mass[0]), mean[0], cov[0], float(yhat[0])


def batch_moments(W: Array, x: Array, gx: Array | None = None) -> tuple[Array, Array, Array, Array]:
    """:func:`quadrature_moments` of S measures at once: mass (S,), mean (S, d), covariance (S, d, d), ∫ g dμ (S,).

    Args:
        W: quadrature weights, one measure per row, shape (S, N).
        x: the nodes, shape (N, d).
        gx: the readout at the nodes, shape (N,); None gives NaN for ∫ g dμ.
    """
    mass = W.sum(axis=1)
    mean = (W @ x) / mass[:, None]
    xc = x[None] - mean[:, None]  # centred nodes, (S, N, d): no cancellation in the covariance
    cov = np.matmul((W[:, :, None] * xc).transpose(0, 2, 1), xc) / mass[:, None, None]
    yhat = W @ gx if gx is not None else np.full(len(W), math.nan)
    return mass, mean, cov, yhat


def cfl_step(ratio: Array, cfl: float) -> Array:
    """The largest Δt with Δt · ratio ≤ cfl, where ratio = max over cells of outflow/|cell| (inf where ≤ 0).

    Args:
        ratio: per solve, shape () or (S,).
        cfl: the positivity CFL factor.

    Raises:
        NumericalError: a non-finite ratio (the velocity is not finite).
    """
    if not np.all(np.isfinite(ratio)):
        raise NumericalError("non-finite token velocity")
    with np.errstate(divide="ignore"):
        return np.where(ratio > 0, cfl / np.where(ratio > 0, ratio, 1.0), math.inf)


@contextlib.contextmanager
def at_depth_step(step: int, t: float) -> Iterator[None]:
    """Name depth step ``step`` (1-based) and its depth t in a NumericalError raised inside that names neither."""
    try:
        yield
    except NumericalError as e:  # e.g. a non-finite velocity
        if "depth step" not in str(e):
            e.args = (f"{e} at depth step {step}, t = {t:.6g}", *e.args[1:])
        raise


def substeps_error(step: int, t: float) -> NumericalError:
    """The error when the CFL sub-steps of depth step ``step`` (starting at depth t) exceed ``MAX_SUBSTEPS``."""
    return NumericalError(f"the CFL sub-steps do not converge at depth step {step} (velocity blow-up near t = {t:.6g})")


class StepTooLong(InputRefused):
    """The first depth step needs more than :data:`MAX_SUBSTEPS` CFL sub-steps: the input is to blame (exit 2).

    At t = 0 the velocity is that of μ_0 under ρ₀ as given, before any dynamics: no blow-up has happened yet,
    the depth step (``depth.T`` / ``depth.steps``), ``tokens.cfl`` or the inverse temperature make the count.
    """


def first_step_error(need: float, dt: float, cfl: float | None, attention: str | None,
                     noise_need: float = 0.0) -> StepTooLong:
    """The error of a first depth step of ``need`` > :data:`MAX_SUBSTEPS` CFL sub-steps, naming the key to change.

    Args:
        need: the sub-steps the velocity at t = 0 needs (may be inf).
        dt: the depth step.
        cfl: the solver's CFL factor (``tokens.cfl``, halved for DG1), or None if unknown.
        attention: the circle's attention ("unnormalised": the velocity grows like e^β), or None.
        noise_need: the sub-steps the noise alone needs (``tokens.noise`` τ: Δt τ/h² per sub-step), 0 without.

    The key: ``tokens.cfl`` when a CFL factor up to 1 would bring the count within the budget (half of it, for
    DG1's halved factor), else ``tokens.noise`` when the noise alone needs more than the budget, else β for
    unnormalised attention, else ``depth.T`` (with ``depth.steps``).
    """
    if cfl is not None and need * cfl <= MAX_SUBSTEPS / 2:
        key, fix = "tokens.cfl", "raise tokens.cfl (at most 1; the count scales as 1/tokens.cfl)"
    elif noise_need > MAX_SUBSTEPS:
        key, fix = "tokens.noise", "lower τ or use fewer cells (the noise alone needs Δt τ/h² sub-steps)"
    elif attention == "unnormalised":
        key, fix = "tokens.beta", "lower β (heads.init's a): the unnormalised kernel's velocity grows like e^β"
    else:
        key, fix = "depth.T", "raise depth.steps or lower depth.T (the count scales as depth.T / depth.steps)"
    count = f"{need:.3g}" if math.isfinite(need) else "unboundedly many"
    why = " (the velocity is not finite)" if math.isnan(need) else ""
    return StepTooLong(f"{key}: depth step 1 (Δt = {dt:.3g}) needs {count} CFL sub-steps at t = 0{why}, more than "
                       f"the {MAX_SUBSTEPS} a depth step may take, with the velocity of the input itself (nothing "
                       f"has moved yet); {fix}")


def check_depth_step(step: int, t: float, finite: bool, mass: float, outflow: float, mass0: float,
                     outflow_tol: float) -> None:
    """The checks after every depth step of a token solve (theory §1.3: mass balance with the outflow).

    Raises:
        NumericalError: non-finite density; |∫μ_t + outflow − ∫μ_0| > 1e-9 ∫μ_0 (positivity lost); outflow
            beyond ``outflow_tol`` ∫μ_0 (interface: exit status 3).
    """
    if not finite:
        raise NumericalError(f"non-finite token density at depth step {step}, t = {t:.6g}")
    balance = abs(mass + outflow - mass0)
    if balance > 1e-9 * mass0:
        raise NumericalError(f"token mass balance violated by {balance / mass0:.3g} at depth step {step}, "
                             f"t = {t:.6g} (positivity lost)")
    if outflow > outflow_tol * mass0:
        raise NumericalError(f"mass leaving the token domain: outflow {outflow / mass0:.3g} of the mass > "
                             f"tokens.outflow_tol = {outflow_tol:g} at depth step {step}, t = {t:.6g} "
                             "(enlarge tokens.box)")
