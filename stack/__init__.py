"""The native local stack: real Kafka (KRaft), otelcol, Prometheus and Flink, no Docker.

``setup`` fetches and builds what is missing (cached outside the repo), ``supervisor``
starts, health-checks and stops the processes by PID.
"""
