"""The jobs floor: each command's job, and the one scaffold they share.

A job reads the whole config, owns the output directory and writes the report; nothing below this floor reads a
whole config or decides what is written where. The scaffold (:class:`~mfpde.jobs.scaffold.JobDir`) holds what every
job does alike: the output directory as a transaction (:mod:`mfpde.outdir`), the resolved ``config.toml``, the
report's head (command, version, domain, ranks), its wall time and its writing, ``status`` "failed" with what was
computed when a solve fails.

* :mod:`~mfpde.jobs.transport`: ``mfpde transport`` on every domain, through its package's ``job`` module (its
  solve, picture and summary; :mod:`mfpde.domains`);
* :mod:`~mfpde.jobs.continuation`: ``mfpde continuation`` of noisy tokens (the algorithm:
  :mod:`mfpde.bifurcation`);
* :mod:`~mfpde.jobs.run` and :mod:`~mfpde.jobs.records`: ``mfpde run``, and what it writes (checkpoints, resume,
  ``history.csv``, plots).
"""
