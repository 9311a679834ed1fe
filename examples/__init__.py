"""Examples of partir_core on models written with JAX's libraries (run from a checkout; not in the wheel)."""
