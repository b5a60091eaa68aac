"""The twin: the finite transformer of theory §1.1 (N tokens, H heads, L layers) in JAX, trained beside the PDE.

* :mod:`mfpde.twin.network`: the network, its risk and autodiff gradient (pure JAX);
* :mod:`mfpde.twin.tokens`: its inputs (N tokens of each μ_0, or the token limit) and heads drawn from ρ₀;
* :mod:`mfpde.twin.train`: Langevin (Euler–Maruyama), SGD or Adam over the seeds of one size;
* :mod:`mfpde.twin.compare`: W1 of heads and token clouds, the fits of the gaps;
* :mod:`mfpde.twin.pde`, :mod:`mfpde.twin.report`, :mod:`mfpde.twin.plots`, :mod:`mfpde.jobs.twin`: the command
  ``mfpde twin`` (theory §12).
"""
