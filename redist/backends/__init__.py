"""Interpreters of :class:`redist.program.Program`: numpy (reference) here; JAX and MPI in
:mod:`redist.jax` and :mod:`redist.mpi`."""
