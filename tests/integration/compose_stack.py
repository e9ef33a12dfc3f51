"""The same integration tests against docker-compose through testcontainers, where a Docker
engine exists (``INFERSIGHT_TEST_BACKEND=docker``). Not exercised on our CI machines, which have
no Docker engine; the native stack is the tested path."""

from __future__ import annotations

import time
from pathlib import Path

from infersight.stack.components import REGIONS, http_ok
from infersight.stack.kafka_admin import kafka_ready
from infersight.stack.ports import PortPlan

REPO = Path(__file__).resolve().parents[2]


class ComposeLayout:
    """The subset of StackLayout the tests use, pointing at the compose services' host ports."""

    def __init__(self, ports: PortPlan) -> None:
        self.ports = ports
        self.host = ports.host
        self.regions = REGIONS
        self.kafka_bootstrap = f"{self.host}:{ports.kafka}"
        self.prometheus_url = f"http://{self.host}:{ports.prometheus}"
        self.flink_rest_url = f"http://{self.host}:{ports.flink_rest}"
        self.flink_python = "/usr/local/bin/python"  # the interpreter inside the Flink image

    def otlp_endpoint(self, region: str, protocol: str = "grpc") -> str:
        g = self.ports.gateways[self.regions.index(region)]
        return f"http://{self.host}:{g.otlp_grpc if protocol == 'grpc' else g.otlp_http}"


class ComposeStack:
    def __init__(self) -> None:
        from testcontainers.compose import DockerCompose

        self.compose = DockerCompose(str(REPO), compose_file_name="docker-compose.yml", build=True)
        self.layout = ComposeLayout(PortPlan.default())

    def __enter__(self) -> ComposeStack:
        self.compose.start()
        deadline = time.monotonic() + 300
        checks = [lambda: kafka_ready(self.layout.kafka_bootstrap),
                  lambda: http_ok(f"{self.layout.prometheus_url}/-/ready"),
                  lambda: http_ok(f"{self.layout.flink_rest_url}/config")]
        checks += [lambda g=g: http_ok(f"http://{self.layout.host}:{g.health}/") for g in self.layout.ports.gateways]
        while not all(check() for check in checks):
            if time.monotonic() > deadline:
                raise TimeoutError("docker-compose stack did not become healthy in 300 s")
            time.sleep(2)
        return self

    def __exit__(self, *exc) -> None:
        self.compose.stop()
