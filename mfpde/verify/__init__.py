"""``mfpde verify``: every theorem of the model checked numerically against independent references.

Each check (:mod:`mfpde.verify.registry`) compares the solvers with something they did not produce: a
closed form of theory §6 (:mod:`mfpde.exact`), finite differences, or an independent particle code; its
threshold comes from the theory or from the scheme's order. Checks by group: :mod:`mfpde.verify.adjoint`
(theory §3), :mod:`mfpde.verify.transport` (§1.3, §5.2, §6.1), :mod:`mfpde.verify.shallow` (§2, §4, §6.2).
The job (:mod:`mfpde.jobs.verify`) prints the table and writes ``report.json``.
"""

from mfpde.verify.registry import CHECKS, Check, Outcome, Series, register

__all__ = ["CHECKS", "Check", "Outcome", "Series", "register"]
