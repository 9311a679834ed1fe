"""Optional dependencies: the error that names the extra to install when a feature's dependency is missing.

``import redist`` and planning need only numpy and ml_dtypes. The rest comes with an extra
(``pip install 'redist[jax]'``, ``[mpi]``, ``[verify]``, ``[bench]``, or ``[all]``), and a module that needs one
imports its dependency through :func:`missing_extra` so that a missing one says what to install.
"""

from __future__ import annotations


def missing_extra(error: ModuleNotFoundError, feature: str, extra: str) -> ModuleNotFoundError:
    """The error to raise in place of ``error`` (an optional dependency that did not import): it names the
    ``feature`` that needs it and the ``extra`` that installs it. Still a ModuleNotFoundError, so code that
    probes for the feature with ``except ImportError`` keeps working."""
    return ModuleNotFoundError(f"{feature} needs {error.name}, which is not installed: "
                               f"pip install 'redist[{extra}]'", name=error.name)


class MissingModule:
    """Stands in for an optional module that is not installed, so that the module using it still imports; any
    use (an attribute of it) raises the :func:`missing_extra` error."""

    def __init__(self, error: ModuleNotFoundError, feature: str, extra: str):
        self._args = (error, feature, extra)

    def __getattr__(self, name: str):
        raise missing_extra(*self._args)
