"""The token data: scikit-learn's digits read without importing scikit-learn."""

import numpy as np


def test_bundled_digits_are_scikit_learns():
    """The digits read from scikit-learn's bundled file without importing scikit-learn are load_digits' own."""
    from sklearn.datasets import load_digits

    from mfpde.tokens.box.data import bundled_digits

    images, target = bundled_digits()
    ref = load_digits()
    assert images.shape == (1797, 8, 8) and np.array_equal(images, ref.images)
    assert np.array_equal(target, ref.target)
