"""Attribute names used across components (the full registry grows with the instrumentation).

OpenTelemetry semantic-convention names first; ``infersight.*`` only where none exists.
"""

# Resource attributes (OpenTelemetry resource semantic conventions).
CLOUD_REGION = "cloud.region"
SERVICE_NAME = "service.name"

# Our own, where no convention exists.
DEPLOYMENT_TRACK = "infersight.deployment.track"
