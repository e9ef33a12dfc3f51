"""The one dead-letter builder every job uses (schema: ``schemas/deadletter.py``): the reason, the source
(topic, partition and offset where the job's source exposes them, the job) and the offending bytes capped at
``MAX_PAYLOAD_BYTES`` with their full size and SHA-256. Pure: no PyFlink."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Sequence

from infersight.schemas.deadletter import MAX_PAYLOAD_BYTES

_JSON = {"separators": (",", ":")}


def dead_letter(job: str, reason: str, raw: bytes | str, *, problems: Sequence[str] | None = None,
                topic: str | None = None, partition: int | None = None, offset: int | None = None,
                trace_id: str | None = None, now_ns: int | None = None,
                max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """A DLQ record (JSON text). ``raw`` is the offending input (a ``str`` is taken as its UTF-8 bytes)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    kept = data[:max_payload_bytes]
    return json.dumps({
        "reason": reason, "problems": list(problems) if problems else [reason], "job": job, "trace_id": trace_id,
        "source": {"topic": topic, "partition": partition, "offset": offset},
        "raw_base64": base64.b64encode(kept).decode("ascii"), "raw_size": len(data),
        "raw_sha256": hashlib.sha256(data).hexdigest(), "raw_truncated": len(kept) < len(data),
        "seen_ns": time.time_ns() if now_ns is None else now_ns,
    }, **_JSON)


def json_of(item: object) -> str:
    """A parsed JSON item back as compact JSON text (what a dead letter of one record of a batch carries)."""
    try:
        return json.dumps(item, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError):
        return repr(item)
