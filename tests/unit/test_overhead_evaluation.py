"""bench.overhead's evaluation figures: they measure what they say (the numbers themselves are the benchmark's)."""

import pytest

from bench.overhead import evaluation_figures


def test_evaluation_figures_cover_the_request_path_the_worker_and_a_full_queue_that_never_blocks():
    n = 50
    figures = evaluation_figures(n, 3)
    # the stuck evaluator holds one answer, the queue 8 more: every later submit is dropped at once, none waits
    # (a blocking put would never return here: the stuck evaluator is released only after the timed loops)
    assert figures["evaluation_dropped_queue_full"] >= 16 - 9 + (n + 5 * n) + n
    assert figures["evaluation_sample_rate"] == 0.01
    # per request = per evaluation x the sample rate, both rounded from the unrounded figure (hence the 0.01)
    assert figures["evaluation_worker_us_per_request"] == pytest.approx(
        figures["evaluation_worker_us_per_eval"] * figures["evaluation_sample_rate"], abs=0.011)
    for key in ("evaluation_request_path_ratio", "evaluation_submit_unsampled_ns", "evaluation_submit_queue_full_ns",
                "evaluation_worker_us_per_eval"):
        assert figures[key] > 0, key
    low, high = figures["evaluation_request_path_ratio_iqr"]
    assert low <= high
