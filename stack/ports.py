"""Port plans: which loopback port each component of one stack listens on.

The default plan uses each tool's customary port where one component owns it
(Kafka 9092, Prometheus 9090, Flink 8081, OTLP 4317/4318 for the first region);
``from_base`` lays every port out from one base so two stacks never collide,
and ``free`` asks the kernel for unused ports (tests).
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

from infersight.stack.errors import StackError


@dataclass(frozen=True)
class GatewayPorts:
    otlp_grpc: int
    otlp_http: int
    health: int
    telemetry: int


@dataclass(frozen=True)
class PortPlan:
    host: str
    kafka: int
    kafka_controller: int
    prometheus: int
    flink_rest: int
    flink_rpc: int
    sink_health: int
    sink_telemetry: int
    gateways: tuple[GatewayPorts, ...] = field(default_factory=tuple)
    # last, with a default: a plan saved before Alertmanager joined the stack loads with 0 (that stack runs
    # without it until it is started afresh)
    alertmanager: int = 0
    # the sink's OTLP receiver for the Flink cluster's own metrics (its OpenTelemetry reporter); 0 in a plan saved
    # before it existed: that stack's Flink reports nothing until it is started afresh
    sink_otlp: int = 0
    kafka_metrics: int = 0  # the broker's JMX exporter (Prometheus scrapes it); 0 in older plans: none
    verdicts: int = 0  # the canary verdict service (0: not started, as for alertmanager)

    @classmethod
    def default(cls, regions: int = 3, host: str = "127.0.0.1") -> PortPlan:
        gateways = tuple(
            GatewayPorts(4317 + 10 * i, 4318 + 10 * i, 13133 + 10 * i, 8888 + 10 * i) for i in range(regions)
        )
        # Alertmanager's customary 9093 is Kafka's controller here
        return cls(host, 9092, 9093, 9090, 8081, 6123, 13183, 8938, gateways, alertmanager=9095, sink_otlp=4397,
                   kafka_metrics=9404, verdicts=8089)

    @classmethod
    def from_base(cls, base: int, regions: int = 3, host: str = "127.0.0.1") -> PortPlan:
        if not 1024 <= base <= 65535 - 11 - 4 * regions:
            raise StackError(f"base port {base} leaves no room for the stack's ports",
                             "pick a --base-port between 1024 and 65000")
        gateways = tuple(
            GatewayPorts(base + 10 + 4 * i, base + 11 + 4 * i, base + 12 + 4 * i, base + 13 + 4 * i)
            for i in range(regions)
        )
        return cls(host, base, base + 1, base + 2, base + 3, base + 4, base + 5, base + 6, gateways,
                   alertmanager=base + 7, sink_otlp=base + 8, kafka_metrics=base + 9,
                   verdicts=base + 10 + 4 * regions)

    @classmethod
    def free(cls, regions: int = 3, host: str = "127.0.0.1") -> PortPlan:
        """Ports the kernel reports unused right now (tests run stacks side by side)."""
        socks = []
        try:
            for _ in range(11 + 4 * regions):
                s = socket.socket()
                s.bind((host, 0))
                socks.append(s)
            ports = [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()
        gateways = tuple(GatewayPorts(*ports[7 + 4 * i: 11 + 4 * i]) for i in range(regions))
        kafka, controller, prometheus, flink_rest, flink_rpc, sink_health, sink_telemetry = ports[:7]
        return cls(host, kafka, controller, prometheus, flink_rest, flink_rpc, sink_health, sink_telemetry,
                   gateways, alertmanager=ports[7 + 4 * regions], sink_otlp=ports[8 + 4 * regions],
                   kafka_metrics=ports[9 + 4 * regions], verdicts=ports[10 + 4 * regions])

    def named(self) -> Iterator[tuple[str, int]]:
        """Every port with the name of what listens there."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int):
                yield f.name, value
        for i, g in enumerate(self.gateways):
            for f in dataclasses.fields(g):
                yield f"gateway{i}.{f.name}", getattr(g, f.name)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PortPlan:
        gateways = tuple(GatewayPorts(**g) for g in data.pop("gateways"))
        return cls(**data, gateways=gateways).completed()

    def completed(self) -> PortPlan:
        """A plan saved before a component existed has 0 for its port (that component would never start): the
        port its scheme gives it, when every other port is that scheme's (the default ports, or a base port's)."""
        names = [f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), int)]
        unset = [n for n in names if getattr(self, n) == 0]
        if not unset:
            return self
        schemes = [PortPlan.default(len(self.gateways), self.host)]
        try:
            schemes.append(PortPlan.from_base(self.kafka, len(self.gateways), self.host))
        except StackError:
            pass
        for scheme in schemes:
            if self.gateways == scheme.gateways and all(getattr(self, n) in (0, getattr(scheme, n)) for n in names):
                return dataclasses.replace(self, **{n: getattr(scheme, n) for n in unset})
        return self


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False
