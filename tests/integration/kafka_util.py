"""Test helpers for reading topics with the real Kafka client."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Message


def consume_until(bootstrap: str, topic: str, match: Callable[[Message], Any], timeout_s: float = 60.0) -> Any:
    """Read ``topic`` from the beginning until ``match`` returns something truthy; return it."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"test-{uuid.uuid4()}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            found = match(msg)
            if found:
                return found
    finally:
        consumer.close()
    raise AssertionError(f"nothing matching arrived on {topic} within {timeout_s} s")
