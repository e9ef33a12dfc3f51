"""Keyed state that expires: a processing-time TTL on a state descriptor, so the state of a key that stopped
(a series, a deployment, a model in a region) is dropped and keyed state stays bounded however many label
values pass through the cardinality bound over time. PyFlink is imported when called (jobs' functions only)."""

from __future__ import annotations

from typing import Any


def expiring(descriptor: Any, ttl_s: float) -> Any:
    """The descriptor (value, list or map state) with a processing-time TTL renewed on every write (``ttl_s`` <=
    0: kept forever): a key that comes back after it starts over."""
    if ttl_s > 0:
        from pyflink.common import Time
        from pyflink.datastream.state import StateTtlConfig

        # Cleanup named explicitly, the default background one off: PyFlink 2.x builds the default's RocksDB
        # filter with a py4j Duration, and a task manager's Python (thread mode) has no py4j gateway: the task
        # failed opening its state. Incremental cleanup is what the heap backend does in the background anyway.
        descriptor.enable_time_to_live(
            StateTtlConfig.new_builder(Time.milliseconds(int(ttl_s * 1000)))
            .set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite)
            .set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)
            .disable_cleanup_in_background()
            .cleanup_incrementally(10, False)
            .cleanup_full_snapshot()
            .build())
    return descriptor
