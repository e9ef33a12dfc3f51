"""The quality job's one-pass grouping of request records (stream._request_partials) gives exactly the partials of
the two-level grouping it replaced (``_partials`` with ``aggregate.add_requests``): the same keys, counts, series
and histograms, over several windows, regions, models, versions and tracks, errors included."""

from __future__ import annotations

import numpy as np

from infersight.flink_jobs.quality.aggregate import add_requests
from infersight.flink_jobs.quality.stream import _partials, _request_partials, read_requests
from infersight.schemas.records import dump_batch
from infersight.schemas.units import NS
from tests.support.sample_requests import sample_records


def test_one_pass_partials_equal_the_two_level_grouping():
    records = [r.to_dict() for r in sample_records(3000, 1_800_000_005 * NS, 25.0, seed=3, error_rate=0.1)]
    for i, r in enumerate(records[::7]):
        r.update(model_version=f"v{i % 3}", track=("canary", "shadow", "stable")[i % 3],
                 error_type=("TimeoutError", "503", "invalid_request", "cancelled", None)[i % 5])
    for window_s in (10, 60):
        new = _request_partials(records, window_s)
        old = _partials(records, "end_ns", window_s, add_requests)
        assert list(new) == list(old)
        for key, (n, partial) in old.items():
            n_new, partial_new = new[key]
            assert n_new == n and list(partial_new) == list(partial)
            for series, agg in partial.items():
                got = partial_new[series]
                assert got.evaluators == agg.evaluators == {} and list(got.histograms) == list(agg.histograms)
                for name, h in agg.histograms.items():
                    assert got.histograms[name].n == h.n and np.array_equal(got.histograms[name].counts, h.counts)
    partials, letters = read_requests(dump_batch(records), 10)
    assert not letters and sum(n for n, _ in partials.values()) == len(records)
