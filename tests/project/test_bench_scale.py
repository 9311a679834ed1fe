"""bench/scale.py --quick: the smoke run of the scale benchmark."""

import json
import os
import subprocess
import sys

from bench import scale
from tests import ROOT


def test_quick_run_writes_figures_and_meets_the_targets_it_checks(tmp_path):
    """In a fresh interpreter: its peak memory target counts the run's own process (a pytest worker's high-water
    mark is that of every test it ran before)."""
    out = tmp_path / "scale.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale.py"), "--quick", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert (tmp_path / "scale_time.png").stat().st_size > 0
    by_label = {s["label"]: s for s in result["summaries"]}
    assert set(by_label) == set(scale.QUICK)
    for s in by_label.values():
        assert s["pairs"] >= 1 and s["timeouts"] == 0 and s["verify"]["proved"] == s["pairs"]
        assert s["synthesize_s"]["median"] <= s["synthesize_s"]["p99"] <= s["synthesize_s"]["max"]
    assert by_label["transpose 256x256"]["devices"] == 65536
    assert by_label["transpose 256x256"]["ratio_max"] == 1.0
    assert set(result["growth_exponents"]) == set(scale.PHASES)
    assert all(t["met"] for t in result["targets"]), result["targets"]
    assert "transpose 256x256" in proc.stdout


def test_named_pairs_parse_and_random_groups_draw_pairs_of_rank_1_or_more():
    for label in [*scale.NAMED, *scale.HARD_TO_VERIFY]:
        ((src, dst),) = scale._pairs(label, 1, 0)
        assert src.shape == dst.shape and src.mesh == dst.mesh
    for label in ("2^16", "3x5x7"):
        pairs = scale._pairs(label, 4, 0)
        assert len(pairs) == 4 and all(src.rank >= 1 for src, _ in pairs)
        assert pairs == scale._pairs(label, 4, 0)
