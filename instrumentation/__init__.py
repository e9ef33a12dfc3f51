"""In-process instrumentation for LLM serving: a generic request API, metrics that do not depend on trace
sampling, GPU gauges, and (later) engine adapters. Depends on opentelemetry-api/sdk only."""

from infersight.instrumentation.api import Instrumentation
from infersight.instrumentation.config import Settings, build_resource
from infersight.instrumentation.meters import views
from infersight.instrumentation.request import STAGES, RequestContext, Stage

__all__ = ["STAGES", "Instrumentation", "RequestContext", "Settings", "Stage", "build_resource", "views"]
