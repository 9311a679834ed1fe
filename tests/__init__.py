"""The test suite, by package: ``tests/redist`` (types, synthesis, verification, the runtimes, the CLI),
``tests/partir_core`` (partitioning whole JAX functions) and ``tests/project`` (the documentation's examples,
the layering of the packages, packaging, the proofs and bench scripts)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository root
