"""Shared by the partir_core tests: reference models with inputs (built once) and result comparison."""

import jax
import numpy as np

from partir_core import models

_MODELS = {}


def model_and_inputs(name):
    """``(model, example inputs, unpartitioned result)`` of a reference model, built once per session."""
    if name not in _MODELS:
        m = models.MODELS[name]()
        ins = m.init(jax.random.key(0))
        _MODELS[name] = (m, ins, m.step(*ins))
    return _MODELS[name]


def assert_same(got, want):
    """Same pytree, leaves equal up to float rounding."""
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
