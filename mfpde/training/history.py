"""The rows of a run's history: what each row of ``history.csv`` holds and which samples the plots show.

Computed here, written by the run job (:mod:`mfpde.jobs.records`).
"""

from __future__ import annotations

import math

import numpy as np

from mfpde.fields import FieldFiles
from mfpde.tokens.box.adjoint import Gradient
from mfpde.training.problem import CoupledProblem

__all__ = ["ACCURACY_KEYS", "GIBBS_KEYS", "HISTORY_KEYS", "N_SNAPSHOTS", "classification", "history_columns",
           "history_row", "plot_samples"]

#: The columns of ``history.csv`` (interface.md).
HISTORY_KEYS = ["step", "s", "risk", "free_energy", "neg_entropy", "mass_rho", "min_rho", "grad_norm", "wall_s"]
#: Columns added for entropic runs: KL(ρ_s ‖ p_ρ_s) and ‖ρ_s − p_ρ_s‖_L¹ (summed over layer blocks).
GIBBS_KEYS = ["kl_gibbs", "gibbs_residual_l1"]
#: Columns added for classification data (sign of ŷ against the sign of the target).
ACCURACY_KEYS = ["train_accuracy", "test_accuracy", "test_risk"]
#: Training samples per class (sign of the target) whose μ_t go into ``tokens.png``.
N_SNAPSHOTS = 2


def history_row(cp: CoupledProblem, grad: Gradient, step: int, s: float, wall: float,
                test_fields: FieldFiles | None = None,
                test_yhat: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """One row of ``history.csv`` for the current ρ and its gradient (potentials already set). Collective.

    With ``test_fields`` (the last row of a run) the held-out samples' μ_T are written there as well
    (``mu_T_test.bp``): the final outputs take the held-out accuracy from this row instead of solving again.
    ``test_yhat``, if given, receives ŷ of the held-out samples under ``"test"`` (shape (n_test,)).
    """
    st = cp.state
    fe = st.free_energy(grad.risk)
    gn = st.dissipation_norm()
    row = {"step": step, "s": s, "risk": fe["risk"], "free_energy": fe["free_energy"], "neg_entropy": fe["entropy"],
           "mass_rho": fe["mass_rho"], "min_rho": fe["min_rho"], "grad_norm": gn, "wall_s": wall}
    if st.lam > 0:
        diag = [st.fp.diagnostics(r, phi) for r, phi in zip(st.rhos, st.phis, strict=True)]
        row["kl_gibbs"] = math.fsum(float(d["kl"]) for d in diag)  # type: ignore[arg-type]
        row["gibbs_residual_l1"] = math.fsum(float(d["l1_gibbs"]) for d in diag)  # type: ignore[arg-type]
    pb = cp.problem
    if classification(cp):  # accuracy per row, the held-out set transported once
        y = np.array([smp.target for smp in pb.train])
        row["train_accuracy"] = float(np.mean(np.sign(grad.yhat) == np.sign(y)))
        if pb.test:
            yt = np.array([smp.target for smp in pb.test])
            yh = cp.objective.predict(pb.test, cp.heads(), test_fields, tag="test")
            if test_yhat is not None:
                test_yhat["test"] = yh
            row["test_accuracy"] = float(np.mean(np.sign(yh) == np.sign(yt)))
            row["test_risk"] = float(0.5 * np.mean((yh - yt) ** 2))
    return row


def classification(cp: CoupledProblem) -> bool:
    """Whether the sign accuracy is reported: digits, or a data file whose targets are all −1 or +1."""
    pb, kind = cp.problem, cp.sec.data.kind
    return kind == "digits" or (kind == "file" and bool(pb.train)
                                and all(abs(s.target) == 1 for s in pb.train + pb.test))


def history_columns(cp: CoupledProblem) -> list[str]:
    """The columns of this run's ``history.csv`` (the keys of its history rows).

    :data:`HISTORY_KEYS`, then :data:`GIBBS_KEYS` (entropic runs) and :data:`ACCURACY_KEYS` (classification data;
    the held-out ones with a held-out set).
    """
    acc = ACCURACY_KEYS if cp.problem.test else ACCURACY_KEYS[:1]
    return HISTORY_KEYS + (GIBBS_KEYS if cp.state.lam > 0 else []) + (acc if classification(cp) else [])


def plot_samples(cp: CoupledProblem) -> list[int]:
    """The training samples whose μ_t the plots show: the first :data:`N_SNAPSHOTS` of each sign of the target."""
    signs = np.sign([smp.target for smp in cp.problem.train])
    return sorted(i for c in np.unique(signs) for i in np.flatnonzero(signs == c)[:N_SNAPSHOTS].tolist())
