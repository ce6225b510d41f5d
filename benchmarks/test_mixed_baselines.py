"""The table of ``python -m benchmarks.mixed_baselines`` (issue #18): per-domain accuracy
and the oracle router."""

from __future__ import annotations

from benchmarks.mixed_baselines import tabulate


def test_oracle_router_counts_a_question_right_if_any_worker_was():
    domains = {"a": "arithmetic", "b": "knowledge", "c": "word"}
    verdicts = {"calculator": {"a": True, "b": False, "c": False}, "smol": {"b": True}}
    rows = {r["strategy"]: r for r in tabulate(verdicts, domains, extra={"x": {"c": True}})}
    assert rows["oracle router"]["all"] == 2 / 3
    assert rows["single:smol"]["knowledge"] == 1.0 and rows["single:smol"]["arithmetic"] == 0
    assert rows["x"]["word"] == 1.0
