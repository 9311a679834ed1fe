"""The interpreters of a lowered :class:`redist.program.Program`, side by side.

- :mod:`~redist.backends.interpreter`: the one loop that runs a program's instructions in order, and the
  :class:`~redist.backends.interpreter.Backend` interface it drives (one method per instruction kind).
- :mod:`~redist.backends.numpy_backend`: the reference, every device's buffer in one process.
- :mod:`~redist.backends.jax_backend`: one device's buffer under ``jax.shard_map``, ``lax`` collectives; with
  it :mod:`~redist.backends.jax_stages` (a plan's stages across meshes on JAX devices, the transfers as copies
  from device to device).
- :mod:`~redist.backends.mpi_backend`: one rank's buffer, mpi4py collectives on sub-communicators; with it
  :mod:`~redist.backends.mpi_stages` (a plan's stages across meshes, the transfers point to point),
  :mod:`~redist.backends.mpi_channels` (communicators, the ranks' verdict, what a rank keeps between calls),
  :mod:`~redist.backends.mpi_placement` (where each instruction's data lands),
  :mod:`~redist.backends.mpi_transfers` (numpy memory as MPI messages) and
  :mod:`~redist.backends.mpi_reductions` (reductions as numpy computes them).

The backends run programs and never plan: none imports :mod:`redist.synthesis`. The public entry points
that synthesize first are :func:`redist.execute`, :mod:`redist.jax` and :mod:`redist.mpi`.
"""
