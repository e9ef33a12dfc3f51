"""Compatibility of the serving-pod install with the OpenTelemetry a serving image already holds: the wheel in
fresh virtual environments with the oldest and newest supported OpenTelemetry and in one prepared like a vLLM
image. Needs PyPI (or a mirror), not the local stack."""
