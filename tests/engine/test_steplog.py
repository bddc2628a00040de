"""StepLog: the per-phase step log a result file carries (engine.step_log)."""

from __future__ import annotations

import random

from granikv.engine.steplog import PhaseLog, StepLog


def test_by_batch_buckets_every_step_by_its_request_count():
    log = PhaseLog()
    rng = random.Random(0)
    steps = [(rng.randint(1, 600), rng.random() / 100) for _ in range(1000)]
    for reqs, sec in steps:
        log.add(reqs, reqs, sec)
    s = log.summary(keep=0)
    assert sum(n for n, _ in s["by_batch"].values()) == log.count == len(steps)
    assert abs(sum(t for _, t in s["by_batch"].values()) - log.total_s) < 1e-2
    for key, (n, _) in s["by_batch"].items():
        b = int(key)
        assert b & (b - 1) == 0  # a power of two
        assert n == sum(1 for reqs, _ in steps if b // 2 < reqs <= b or (b == 1 and reqs == 1))
    assert "recent" not in s and len(StepLog().summary()["extend"]["by_batch"]) == 0


def test_a_step_of_one_request_and_of_exactly_a_power_of_two_land_in_their_own_bucket():
    log = PhaseLog()
    for reqs in (1, 2, 3, 4, 256, 257):
        log.add(reqs, reqs, 0.001)
    assert {k: v[0] for k, v in log.summary(keep=0)["by_batch"].items()} == {"1": 1, "2": 1, "4": 2, "256": 1,
                                                                             "512": 1}


def test_slowest_steps_are_the_runs_largest_wherever_they_fall():
    """A one-off stall early in a run (outside `recent`, diluted in its by-batch bucket) is
    named by its step index, request count and time."""
    log = PhaseLog()
    rng = random.Random(1)
    times = [rng.uniform(0.010, 0.020) for _ in range(2000)]
    times[37] = 1.5  # the stall, long before the last 256 steps
    for i, sec in enumerate(times):
        log.add(256, 256 if i % 3 else 128, sec)
    s = log.summary(keep=0)
    want = sorted(range(len(times)), key=lambda i: times[i], reverse=True)[:log.keep_slowest]
    assert [row[0] for row in s["slowest"]] == want
    assert s["slowest"][0] == [37, 256 if 37 % 3 else 128, 1500.0]
    assert s["recent_max_ms"] < 21  # what the log showed before: the stall is not in `recent`
    assert [row[2] for row in s["slowest"]] == sorted((row[2] for row in s["slowest"]), reverse=True)


def test_slowest_of_a_short_phase_lists_every_step():
    log = PhaseLog()
    for ms in (3.0, 1.0, 2.0):
        log.add(1, 1, ms / 1e3)
    assert log.summary(keep=0)["slowest"] == [[0, 1, 3.0], [2, 1, 2.0], [1, 1, 1.0]]
