"""Each pair check of ``python -m proofs`` runs end to end on a tiny sample (the full run takes half an hour,
so a part that crashes would otherwise be found only there)."""

from proofs import exhaustive as ex


def test_each_pair_check_runs_on_a_tiny_sample():
    runs = [ex.run_exhaustive(workers=1, max_devices=4, max_rank=1),
            ex.run_exhaustive(workers=1, max_devices=4, max_rank=1, creating=True),
            ex.run_random(n=8, workers=1), ex.run_random_uneven(n=8, workers=1), ex.run_random_creating(n=8, workers=1),
            *ex.run_features(workers=1, n_random=8, max_rank=0)]
    for res in runs:
        assert res["cases"] > 0 and res["passed"] == res["cases"] and not res["failed"], res["check"]


def test_the_oracle_sums_bf16_summands_exactly_in_any_order():
    """The oracle's summands stay within what the dtype sums exactly: bf16 holds the integers exactly only up
    to 256, and with larger summands an all-reduce, which sums in another order than the oracle, rounds
    differently (112 to 111), so that ``python -m proofs`` would report a proved bf16 plan as wrong."""
    from proofs.common import oracle
    from redist import Mesh, ShardingType, synthesize

    mesh = Mesh.parse("a0=1,a1=7,a2=1,a3=2")
    src = ShardingType.parse("bf16[15{a3}, 3{a2}, 3{a0}] partial{a1}", mesh)
    dst = ShardingType.parse("bf16[15{a1}, 3{a0}, 3]", mesh)
    program = synthesize(src, dst).program
    assert all(oracle(program, src, dst, seed=seed)[0] for seed in range(20))
