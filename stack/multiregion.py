"""The multi-region topology's own components (``infersight up --topology multi-region``).

Per region: a KRaft broker (the stack's ``server.properties``) that the region's gateways write to, with a
second listener used only by MirrorMaker 2 and advertised as the port of the region's link relay
(``stack/relay.py``), so MM2 reaches each region only through its link. On the global side: the stack's
usual Kafka (``StackLayout.kafka``, where every job runs) and one dedicated MirrorMaker 2
(``org.apache.kafka.connect.mirror.MirrorMaker``, its own classpath from ``stack/pom.xml``'s ``mirror``
profile) with the properties ``stack/mirror.py`` generates, the same description the Helm chart uses.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from infersight.stack import mirror, paths
from infersight.stack.errors import StackError

if TYPE_CHECKING:
    from infersight.stack.components import Component, StackLayout

MIRRORMAKER = "mirrormaker"
MIRRORMAKER_HEAP = "-Xmx384m"
MIRROR_CLASS = "org.apache.kafka.connect.mirror.MirrorMaker"


def regional(layout: StackLayout) -> list[Component]:
    """Each region's broker and link relay (started before the global broker; MirrorMaker 2 after it)."""
    if layout.security.kafka_sasl or layout.security.otlp_tls:
        raise StackError("the multi-region topology runs without TLS/SASL here",
                         "unset INFERSIGHT_TLS_DIR and INFERSIGHT_KAFKA_SASL_*, or use the single topology")
    out: list[Component] = []
    for i, region in enumerate(layout.regions):
        out += [regional_kafka(layout, i, region), relay(layout, i, region)]
    return out


def regional_kafka(layout: StackLayout, index: int, region: str) -> Component:
    p = layout.ports.regional_kafka[index]
    return layout.broker(f"kafka-{region}", layout.data / f"kafka-{region}", p.broker, p.controller,
                         tuple(mirror.mirrored_topics()), mirror=(p.mirror, p.relay))


def relay_url(layout: StackLayout, region: str) -> str:
    """The control endpoint of ``region``'s link (``POST /cut``, ``/reset``, ``/heal``; ``GET /``)."""
    p = layout.ports.regional_kafka[layout.regions.index(region)]
    return f"http://{layout.host}:{p.relay_control}"


def relay(layout: StackLayout, index: int, region: str) -> Component:
    from infersight.stack.components import Component, http_ok

    p = layout.ports.regional_kafka[index]
    name = f"link-{region}"
    url = relay_url(layout, region)
    return Component(
        name=name,
        argv=[sys.executable, "-m", "infersight.stack.relay", "--listen", f"{layout.host}:{p.relay}",
              "--upstream", f"{layout.host}:{p.mirror}", "--control", f"{layout.host}:{p.relay_control}"],
        log=layout.logs / f"{name}.log",
        ports={"relay": p.relay, "control": p.relay_control},
        healthy=lambda: http_ok(f"{url}/healthz"),
    )


def mirror_bootstrap(layout: StackLayout) -> dict[str, str]:
    """Each cluster alias's bootstrap as MM2 sees it: the regions through their relays."""
    regional = {r: f"{layout.host}:{layout.ports.regional_kafka[i].relay}" for i, r in enumerate(layout.regions)}
    return {**regional, mirror.GLOBAL_ALIAS: layout.kafka_bootstrap}


def mirrormaker(layout: StackLayout) -> Component:
    from infersight.stack.components import Component, _java
    from infersight.stack.ports import port_in_use

    conf = layout.state_dir / MIRRORMAKER / "mm2.properties"
    rest = f"http://{layout.host}:{layout.ports.mirrormaker}"

    def prepare() -> None:
        jar = paths.mirror_classpath_dir() / f"connect-mirror-{paths.MIRROR_KAFKA_VERSION}.jar"
        if not jar.exists():
            raise StackError(f"MirrorMaker 2's classpath is missing ({jar})", "run `infersight setup`")
        props = mirror.Mirror(tuple(layout.regions)).native_properties(mirror_bootstrap(layout), rest)
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("# Written by the stack from infersight.stack.mirror (the Helm chart's MM2 uses it too)\n"
                        + "".join(f"{k} = {v}\n" for k, v in props.items()))

    return Component(
        name=MIRRORMAKER,
        argv=[_java(), MIRRORMAKER_HEAP, "-Xms64m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
              f"-Dlog4j2.configurationFile={paths.stack_config('kafka/log4j2.properties')}",
              "-cp", f"{paths.mirror_classpath_dir()}/*", MIRROR_CLASS, str(conf)],
        log=layout.logs / f"{MIRRORMAKER}.log",
        ports={"rest": layout.ports.mirrormaker},
        # its internal REST server binds once the herders are configured
        healthy=lambda: port_in_use(layout.host, layout.ports.mirrormaker),
        prepare=prepare,
    )


REGION_STATUS = "region-status"


def region_status_url(layout: StackLayout) -> str:
    return f"http://{layout.host}:{layout.ports.region_status}"


def region_status(layout: StackLayout) -> Component:
    """The region status service (stack/region_status_service.py): each region probed through its link (the
    bootstrap MM2 uses), the mirrored beacons and MM2's offsets read on the global cluster."""
    from infersight.stack.components import Component, http_ok
    from infersight.stack.region_status_service import MODULE, service_args

    regions = mirror_bootstrap(layout)
    url = region_status_url(layout)
    return Component(
        name=REGION_STATUS,
        argv=[sys.executable, "-m", MODULE,
              *service_args(layout.kafka_bootstrap, {r: regions[r] for r in layout.regions}, layout.host,
                            layout.ports.region_status)],
        log=layout.logs / f"{REGION_STATUS}.log",
        ports={"http": layout.ports.region_status},
        healthy=lambda: http_ok(f"{url}/healthz"),
    )


def statuses(layout: StackLayout) -> dict[str, dict]:
    """Each region's latest status record (``schemas.region_status.RECORD_FIELDS``) from the service."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"{region_status_url(layout)}/status", timeout=5) as resp:
        return {r["region"]: r for r in json.loads(resp.read())["regions"]}


def link(layout: StackLayout, region: str, action: str = "") -> dict:
    """``cut``, ``reset`` or ``heal`` ``region``'s link (``stack/relay.py``); no action: its state and the bytes
    it forwarded each way. Returns the relay's state as JSON."""
    import json
    import urllib.request

    if action not in ("", "cut", "reset", "heal"):
        raise ValueError(f"unknown link action {action!r}: cut, reset or heal")
    request = urllib.request.Request(f"{relay_url(layout, region)}/{action}", method="POST" if action else "GET")
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())
