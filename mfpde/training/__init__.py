"""Training ρ: the objective over the samples, the splitting schemes and the theoretical rates.

* :mod:`~mfpde.training.objective`: R(ρ), δR/δρ, ŷ and the NTK over sample groups (theory §2, §3, §5.5).
* :mod:`~mfpde.training.state`: ρ per layer block, the potentials Φ and the Fokker–Planck solvers (§4).
* :mod:`~mfpde.training.splitting`: the scheme registry (Lie, Strang) over one sub-flow interface.
* :mod:`~mfpde.training.problem`: :class:`CoupledProblem`, the three above for one config.
* :mod:`~mfpde.training.history`: the rows of ``history.csv`` and the samples the plots show.
* :mod:`~mfpde.training.report`, :mod:`~mfpde.training.theory`: what the report says (warnings, accuracy,
  ``predictions.csv``, where the certificate is a bound); fitted and guaranteed rates (§5.4).

The ``run`` job that trains (history, checkpoints, resume, result object) is :mod:`mfpde.jobs.run`; what it
writes (checkpoints, ``history.csv``, plots) is :mod:`mfpde.jobs.records`.
"""

from __future__ import annotations

from mfpde.training.problem import CoupledProblem

__all__ = ["CoupledProblem"]
