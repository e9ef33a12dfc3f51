"""A reference streaming generation server: a tiny randomly initialised byte-level transformer in plain torch,
compiled with torch.compile, generating real tokens one at a time, served over HTTP with streaming
(OpenAI-like ``/v1/completions``), instrumented end to end (generic request API + torch.compile adapter).

    python -m infersight.instrumentation.reference_server --port 8300
    opentelemetry-instrument python -m infersight.instrumentation.reference_server --port 8300   # exports
"""

from infersight.instrumentation.reference_server.engine import Engine, Job
from infersight.instrumentation.reference_server.server import create_app

__all__ = ["Engine", "Job", "create_app"]
