"""The M_sat fit and the hardware-yaml rewrite of the kernels microbenchmark (pure functions
of result records; no GPU)."""

from __future__ import annotations

from harness.microbench.m_sat import M_SAT_BEGIN, fit_m_sat, write_hardware_yaml


def _records(times: dict[tuple[str, int, int], float], g: int) -> list[dict]:
    return [{"op": op, "B": b, "Lp": lp, "g": g, "us": us, "sweep": True}
            for (op, b, lp), us in times.items()]


def test_fit_picks_the_knee():
    # dense wins from B=128 up at every length: the threshold is 128 * g
    g, batches, lps = 4, (8, 32, 128, 512), (2048, 8192)
    t = {}
    for lp in lps:
        for b in batches:
            t[("prefix_cascade", b, lp)] = 10.0 * b
            t[("prefix_dense", b, lp)] = 10.0 * b * (0.5 if b >= 128 else 2.0)
            t[("prefix_dense_cublas", b, lp)] = 1e9
    fit = fit_m_sat(_records(t, g), (g,), lps, batches)
    assert fit["by_g"][g] == 128 * g
    assert fit["regret"][g][str(128 * g)] == 1.0


def test_fit_never_dense_when_cascade_always_wins():
    g, batches, lps = 5, (8, 256), (8192,)
    t = {("prefix_cascade", b, 8192): 1.0 for b in batches}
    t.update({("prefix_dense", b, 8192): 2.0 for b in batches})
    t.update({("prefix_dense_cublas", b, 8192): 3.0 for b in batches})
    fit = fit_m_sat(_records(t, g), (g,), lps, batches)
    assert fit["by_g"][g] > max(batches) * g


def test_hardware_yaml_block_is_replaced_not_appended(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text("name: h200\nsms: 132\n")
    fit = {"by_g": {4: 2048, 5: 640}}
    once = write_hardware_yaml(path, fit, "x.json")
    path.write_text(once)
    twice = write_hardware_yaml(path, {"by_g": {4: 1024, 5: 640}}, "x.json")
    assert twice.count(M_SAT_BEGIN) == 1
    assert "m_sat: 1024" in twice and "m_sat: 2048" not in twice
    assert twice.startswith("name: h200\nsms: 132\n")
