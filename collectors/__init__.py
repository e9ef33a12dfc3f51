"""The infersight otelcol distribution: its builder manifest and the gateway and sink configs.

The same config files serve the native stack (``infersight.stack``) and docker-compose;
deployment-specific values (ports, brokers, region, directories) come from ``INFERSIGHT_*``
environment variables through the collector's env provider.
"""
