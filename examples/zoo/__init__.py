"""The model zoo: training steps written the way each library's own examples write them, to partition.

Each module is one model: ``make()`` → ``(step, inputs)``, a training step (forward, loss, ``jax.grad``, an optax
update) and example inputs, small enough to run in well under a second on a CPU. Its docstring lists, in
literal blocks (``path dim`` lines, or path patterns), the weights an expert would shard under Megatron and under
ZeRO-3 (and, where the model has them, the embeddings and the stacked layer dims); :func:`listed` reads them.

- :mod:`~examples.zoo.flax_mlp`: flax.linen MLP classifier, AdamW.
- :mod:`~examples.zoo.flax_lm`: flax.linen LM (``nn.Embed``, ``nn.scan`` over attention blocks, dropout), Adam.
- :mod:`~examples.zoo.nnx_encoder`: flax.nnx attention encoder classifier, SGD with momentum.
- :mod:`~examples.zoo.eqx_mlp`: equinox MLP (weights ``(out, in)``), AdamW.
- :mod:`~examples.zoo.jax_lm`: plain-JAX LM, ``lax.scan`` over stacked weights, tied embedding, Adam.
- :mod:`~examples.zoo.gnn`: plain-JAX message passing (gather, ``segment_sum``), SGD.
- :mod:`~examples.zoo.convnet`: flax.linen CNN (``nn.Conv``, global average pooling), SGD with momentum.
- :mod:`~examples.zoo.moe`: plain-JAX mixture-of-experts layer, top-2 routing with expert capacity, Adam.
"""

import importlib

NAMES = ("flax_mlp", "flax_lm", "nnx_encoder", "eqx_mlp", "jax_lm", "gnn", "convnet", "moe")


def module(name: str):
    """The zoo module ``name``."""
    return importlib.import_module(f"{__name__}.{name}")


def listed(name: str, heading: str) -> list[list[str]]:
    """The lines of the literal block after the paragraph of zoo module ``name``'s docstring that starts with
    ``heading``, each split into words (``[]`` if there is no such paragraph)."""
    doc = module(name).__doc__
    start = doc.find("\n" + heading)
    if start < 0:
        return []
    block = doc[doc.index("::", start) + 2:].lstrip("\n").split("\n\n", 1)[0]
    return [line.split() for line in block.splitlines() if line.strip()]
