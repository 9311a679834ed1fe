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
