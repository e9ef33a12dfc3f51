"""Port plans: which loopback port each component of one stack listens on.

The default plan uses each tool's customary port where one component owns it
(Kafka 9092, Prometheus 9090, Flink 8081, OTLP 4317/4318 for the first region);
``from_base`` lays every port out from one base so two stacks never collide,
and ``free`` asks the kernel for unused ports (tests).

Each takes a topology: ``single`` (one Kafka, the default) or ``multi-region`` (one KRaft broker per region
with its link relay, the global broker on ``kafka``, and MirrorMaker 2). The plan is saved in the stack's
state file, so the topology is remembered with the ports: ``regional_kafka`` is empty for a single Kafka.
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
    # the receiver of the gateway's own beacons (its internal telemetry, collectors/gateway.yaml); 0 in a plan saved
    # before beacons existed: that gateway listens on the config's default (start that stack afresh)
    beacon: int = 0


@dataclass(frozen=True)
class RegionalKafkaPorts:
    """One region's broker (multi-region topology) and the relay that is its link to the global side."""

    broker: int         # the region's gateways write here
    controller: int
    mirror: int         # a second listener, used only by MirrorMaker 2, reached through the relay
    relay: int          # the region link: MM2 connects here (the broker advertises it on ``mirror``)
    relay_control: int  # the relay's control endpoint (cut / reset / heal)


TOPOLOGIES = ("single", "multi-region")
GATEWAY_PORTS = len(dataclasses.fields(GatewayPorts))
REGIONAL_PORTS = len(dataclasses.fields(RegionalKafkaPorts))


def _check_topology(topology: str) -> None:
    if topology not in TOPOLOGIES:
        raise StackError(f"unknown topology {topology!r}", f"pick one of: {', '.join(TOPOLOGIES)}")


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
    # multi-region topology: one entry per region (empty: a single Kafka), and MirrorMaker 2's internal REST port
    regional_kafka: tuple[RegionalKafkaPorts, ...] = field(default_factory=tuple)
    mirrormaker: int = 0
    region_status: int = 0  # the region status service (multi-region; 0: not started)

    @property
    def topology(self) -> str:
        return "multi-region" if self.regional_kafka else "single"

    @classmethod
    def default(cls, regions: int = 3, host: str = "127.0.0.1", topology: str = "single") -> PortPlan:
        _check_topology(topology)
        gateways = tuple(
            GatewayPorts(4317 + 10 * i, 4318 + 10 * i, 13133 + 10 * i, 8888 + 10 * i, 4319 + 10 * i)
            for i in range(regions)
        )
        regional = tuple(RegionalKafkaPorts(*range(9100 + 10 * i, 9100 + 10 * i + REGIONAL_PORTS))
                         for i in range(regions)) if topology == "multi-region" else ()
        # Alertmanager's customary 9093 is Kafka's controller here; 8083 is Connect's customary REST port
        return cls(host, 9092, 9093, 9090, 8081, 6123, 13183, 8938, gateways, alertmanager=9095, sink_otlp=4397,
                   kafka_metrics=9404, verdicts=8089, regional_kafka=regional,
                   mirrormaker=8083 if regional else 0, region_status=8084 if regional else 0)

    @classmethod
    def from_base(cls, base: int, regions: int = 3, host: str = "127.0.0.1", topology: str = "single") -> PortPlan:
        _check_topology(topology)
        if not 1024 <= base <= 65535 - 13 - (GATEWAY_PORTS + REGIONAL_PORTS) * regions:
            raise StackError(f"base port {base} leaves no room for the stack's ports",
                             "pick a --base-port between 1024 and 65000")
        gateways = tuple(
            GatewayPorts(*range(base + 10 + GATEWAY_PORTS * i, base + 10 + GATEWAY_PORTS * (i + 1)))
            for i in range(regions)
        )
        first = base + 11 + GATEWAY_PORTS * regions  # the multi-region ports follow the single topology's
        regional = tuple(RegionalKafkaPorts(*range(first + REGIONAL_PORTS * i, first + REGIONAL_PORTS * (i + 1)))
                         for i in range(regions)) if topology == "multi-region" else ()
        return cls(host, base, base + 1, base + 2, base + 3, base + 4, base + 5, base + 6, gateways,
                   alertmanager=base + 7, sink_otlp=base + 8, kafka_metrics=base + 9,
                   verdicts=base + 10 + GATEWAY_PORTS * regions, regional_kafka=regional,
                   mirrormaker=first + REGIONAL_PORTS * regions if regional else 0,
                   region_status=first + REGIONAL_PORTS * regions + 1 if regional else 0)

    @classmethod
    def free(cls, regions: int = 3, host: str = "127.0.0.1", topology: str = "single") -> PortPlan:
        """Ports the kernel reports unused right now (tests run stacks side by side)."""
        _check_topology(topology)
        multi = (REGIONAL_PORTS * regions + 2) if topology == "multi-region" else 0
        socks = []
        try:
            for _ in range(11 + GATEWAY_PORTS * regions + multi):
                s = socket.socket()
                s.bind((host, 0))
                socks.append(s)
            ports = [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()
        g = GATEWAY_PORTS
        gateways = tuple(GatewayPorts(*ports[7 + g * i: 7 + g * (i + 1)]) for i in range(regions))
        kafka, controller, prometheus, flink_rest, flink_rpc, sink_health, sink_telemetry = ports[:7]
        rest = ports[11 + g * regions:]
        regional = tuple(RegionalKafkaPorts(*rest[REGIONAL_PORTS * i: REGIONAL_PORTS * (i + 1)])
                         for i in range(regions)) if multi else ()
        return cls(host, kafka, controller, prometheus, flink_rest, flink_rpc, sink_health, sink_telemetry,
                   gateways, alertmanager=ports[7 + g * regions], sink_otlp=ports[8 + g * regions],
                   kafka_metrics=ports[9 + g * regions], verdicts=ports[10 + g * regions],
                   regional_kafka=regional, mirrormaker=rest[-2] if multi else 0,
                   region_status=rest[-1] if multi else 0)

    def named(self) -> Iterator[tuple[str, int]]:
        """Every port with the name of what listens there."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, int) and value:  # 0: a component this plan does not run
                yield f.name, value
        for i, g in enumerate(self.gateways):
            for f in dataclasses.fields(g):
                yield f"gateway{i}.{f.name}", getattr(g, f.name)
        for i, k in enumerate(self.regional_kafka):
            for f in dataclasses.fields(k):
                yield f"regional_kafka{i}.{f.name}", getattr(k, f.name)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PortPlan:
        gateways = tuple(GatewayPorts(**g) for g in data.pop("gateways"))
        regional = tuple(RegionalKafkaPorts(**k) for k in data.pop("regional_kafka", ()))
        return cls(**data, gateways=gateways, regional_kafka=regional).completed()

    def completed(self) -> PortPlan:
        """A plan saved before a component existed has 0 for its port (that component would never start): the
        port its scheme gives it, when every other port is that scheme's (the default ports, or a base port's)."""
        names = [f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), int)]
        unset = [n for n in names if getattr(self, n) == 0]
        if not unset:
            return self
        schemes = [PortPlan.default(len(self.gateways), self.host, self.topology)]
        try:
            schemes.append(PortPlan.from_base(self.kafka, len(self.gateways), self.host, self.topology))
        except StackError:
            pass
        for scheme in schemes:
            same_lists = (self.gateways, self.regional_kafka) == (scheme.gateways, scheme.regional_kafka)
            if same_lists and all(getattr(self, n) in (0, getattr(scheme, n)) for n in names):
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
