"""mfpde: finite elements for the mean-field transformer and its training.

Token transport (McKean–Vlasov continuity equation in depth), adjoint and first variation, and the
parameter Fokker–Planck equation (Wasserstein gradient flow in training time), coupled by splitting.
See ``README.md`` and theory.md for the equations.
"""

from __future__ import annotations

__version__ = "0.1.0"
