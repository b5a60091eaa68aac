"""The token side: one package per token domain, and what the domains share.

* :mod:`~mfpde.tokens.box`: a box Ω ⊂ R^d or a mesh of one (the training problem's domain);
  :mod:`~mfpde.tokens.circle`: the circle (theory §8); :mod:`~mfpde.tokens.sphere`: the sphere S² (§9);
  :mod:`~mfpde.tokens.hypersphere`: S^{d−1} for any d with zonal data (§11).
* Shared: :mod:`~mfpde.tokens.rk` (the depth integrators as coefficient tables, one step and its transpose),
  :mod:`~mfpde.tokens.stepping` (CFL and depth-step checks), :mod:`~mfpde.tokens.limiter` (Zhang–Shu),
  :mod:`~mfpde.tokens.attention` (softmax kernels, §1.2; the head measure is :mod:`mfpde.heads`),
  :mod:`~mfpde.tokens.adaptive` (DOP853 with a PI controller), :mod:`~mfpde.tokens.depths` (output depths);
  :mod:`~mfpde.tokens.resolution` (the resolution check of cluster counts); :mod:`~mfpde.domains` (the list of
  domains, their rules, the dispatch); :mod:`~mfpde.jobs.transport` (the ``transport`` command, above the
  domains).
"""
