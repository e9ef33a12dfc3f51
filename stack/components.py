"""The processes of one local stack: how each is prepared, launched and health-checked."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sysconfig
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from infersight.schemas.topics import ALL_TOPICS, Topic
from infersight.stack import flink_config, paths
from infersight.stack.ports import PortPlan
from infersight.stack.security import TransportSecurity, write_private

REGIONS: tuple[str, ...] = ("us-east-1", "eu-west-1", "ap-southeast-1")
# Your SLO file (dashboards/slo.yaml's format): the stack's Prometheus evaluates rules generated from it
SLO_FILE_ENV = "INFERSIGHT_SLO_FILE"
VERDICT_WEBHOOK_ENV = "INFERSIGHT_VERDICT_WEBHOOK"  # a URL the verdict service POSTs each rollout's first fail to
MLFLOW_TRACKING_ENV = "INFERSIGHT_MLFLOW_TRACKING_URI"  # an MLflow tracking store for the final verdicts
KAFKA_SCRAPE_JOB = "kafka"  # Prometheus' job for the broker's JMX exporter (dashboards.common.KAFKA_JOB)
GATEWAY_MEMORY_LIMIT_MIB = 256
SINK_MEMORY_LIMIT_MIB = 256
# The gateways' live heap is small and their allocation rate high (every OTLP export is decoded and
# re-encoded), so Go's default GOGC=100 collects very often; a larger GOGC with a soft limit under the
# memory_limiter's trades heap for CPU. docker-compose.yml sets the same.
GATEWAY_GO_GC = {"GOGC": "400", "GOMEMLIMIT": f"{GATEWAY_MEMORY_LIMIT_MIB * 3 // 4}MiB"}
KAFKA_HEAP = "-Xmx512m"
# multi-region: four brokers, MirrorMaker 2, Flink with three task managers and Prometheus share 2 cores, 24 GiB
MULTI_REGION_KAFKA_HEAP = "-Xmx384m"
# Each task manager embeds one CPython (thread mode) whose GIL all its Python operators share: one task
# manager capped the jobs' Python at one core. Three, slots spread (see flink/config.yaml): one per job,
# so no job waits for another's interpreter (with two, normalize shared one with archive and saturated it).
TASK_MANAGERS = 3
# What the jobs' Python code imports: the jobs and the schemas they stand on (see python_import_root).
JOB_COMPONENTS = ("schemas", "flink_jobs")


@dataclass
class Component:
    """One supervised process."""

    name: str
    argv: list[str]
    log: Path
    ports: dict[str, int]
    healthy: Callable[[], bool]
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None
    # run once healthy, on every start (a broker's topics): returns what it created, to report
    on_healthy: Callable[[], list[str]] | None = None


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except OSError:
        return False


def http_json(url: str, timeout: float = 1.0) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


class StackLayout:
    """Paths and commands of one stack, derived from its state folder and port plan."""

    def __init__(self, state_dir: Path, ports: PortPlan, regions: tuple[str, ...] = REGIONS,
                 security: TransportSecurity | None = None) -> None:
        if len(regions) != len(ports.gateways):
            raise ValueError("one gateway port set per region")
        if ports.regional_kafka and len(ports.regional_kafka) != len(regions):
            raise ValueError("one regional Kafka port set per region")
        # TLS/SASL settings (stack/security.py): from INFERSIGHT_TLS_DIR, INFERSIGHT_KAFKA_SASL_*; default none.
        self.security = security if security is not None else TransportSecurity.from_env()
        self.state_dir = state_dir
        self.ports = ports
        self.regions = regions
        self.logs = state_dir / "logs"
        self.data = state_dir / "data"

    @property
    def host(self) -> str:
        return self.ports.host

    @property
    def kafka_bootstrap(self) -> str:
        """The stack's Kafka; in the multi-region topology the global cluster, where every job runs."""
        return f"{self.host}:{self.ports.kafka}"

    @property
    def multi_region(self) -> bool:
        return bool(self.ports.regional_kafka)

    def region_bootstrap(self, region: str) -> str:
        """Where ``region``'s gateways write: its own broker (multi-region), else the one Kafka."""
        if not self.multi_region:
            return self.kafka_bootstrap
        return f"{self.host}:{self.ports.regional_kafka[self.regions.index(region)].broker}"

    def normalize_sources(self) -> list[str]:
        """The OTLP topics normalize reads: the mirrored ``<region>.infersight.otlp.*`` on the global cluster
        (multi-region); none for a single Kafka (normalize's own default)."""
        if not self.multi_region:
            return []
        from infersight.stack import mirror

        return mirror.normalize_sources(self.regions)

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.host}:{self.ports.prometheus}"

    @property
    def flink_rest_url(self) -> str:
        return f"http://{self.host}:{self.ports.flink_rest}"

    def otlp_endpoint(self, region: str, protocol: str = "grpc") -> str:
        g = self.ports.gateways[self.regions.index(region)]
        scheme = "https" if self.security.otlp_tls else "http"
        return f"{scheme}://{self.host}:{g.otlp_grpc if protocol == 'grpc' else g.otlp_http}"

    @property
    def flink_conf_dir(self) -> Path:
        return self.state_dir / "flink-conf"

    # -- components -------------------------------------------------------------------

    def components(self) -> list[Component]:
        from infersight.stack import multiregion

        return [
            *(multiregion.regional(self) if self.multi_region else []),
            self.kafka(),
            *([multiregion.mirrormaker(self)] if self.multi_region else []),
            *([multiregion.region_status(self)] if self.multi_region and self.ports.region_status else []),
            self.prometheus(),
            *([self.alertmanager()] if self.ports.alertmanager else []),
            *([self.verdict_service()] if self.ports.verdicts else []),
            *(self.gateway(i, r) for i, r in enumerate(self.regions)),
            self.sink(),
            self.flink_jobmanager(),
            *(self.flink_taskmanager(i) for i in range(TASK_MANAGERS)),
        ]

    def kafka(self) -> Component:
        """The stack's Kafka: the only one in the single topology, the global cluster in the multi-region one."""
        topics = ALL_TOPICS
        if self.multi_region:  # the jobs read the mirrored topics: created with schemas/topics.py's settings
            from infersight.stack import mirror

            topics = (*ALL_TOPICS, *mirror.global_topics(self.regions))
        return self.broker("kafka", self.data / "kafka", self.ports.kafka, self.ports.kafka_controller,
                           topics, metrics=self.ports.kafka_metrics)

    def broker(self, name: str, data: Path, port: int, controller: int, topics: tuple[Topic, ...],
               metrics: int = 0, mirror: tuple[int, int] | None = None) -> Component:
        """One single-node KRaft broker from the stack's ``server.properties``. ``mirror``: (listener port, the
        port advertised for it), a second listener for MirrorMaker 2 alone, reached through a region link."""
        from infersight.stack.kafka_admin import ensure_topics, kafka_ready

        conf = self.state_dir / name / "server.properties"
        bootstrap = f"{self.host}:{port}"
        classpath = f"{paths.kafka_classpath_dir()}/*"
        java = _java()
        heap = MULTI_REGION_KAFKA_HEAP if self.multi_region else KAFKA_HEAP
        jvm = [heap, "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
               f"-Dlog4j2.configurationFile={paths.stack_config('kafka/log4j2.properties')}"]

        def prepare() -> None:
            conf.parent.mkdir(parents=True, exist_ok=True)
            data.mkdir(parents=True, exist_ok=True)
            base = paths.stack_config("kafka/server.properties").read_text()
            listeners = f"PLAINTEXT://{self.host}:{port},CONTROLLER://{self.host}:{controller}"
            advertised = f"PLAINTEXT://{self.host}:{port}"
            if mirror:
                listeners += f",MIRROR://{self.host}:{mirror[0]}"
                advertised += f",MIRROR://{self.host}:{mirror[1]}"
            overrides = [
                f"listeners={listeners}",
                f"advertised.listeners={advertised}",
                f"controller.quorum.bootstrap.servers={self.host}:{controller}",
                f"log.dirs={data}",
            ]
            if mirror:
                overrides.append("listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
                                 "MIRROR:PLAINTEXT")
            if self.multi_region:  # four brokers on 2 cores
                overrides += ["num.io.threads=2", "background.threads=2"]
            if self.security.kafka_sasl:  # the client listener becomes SASL_SSL (stack/security.py)
                keystore = write_private(conf.parent / "keystore.pem", self.security.keystore_pem())
                overrides[:2] = self.security.broker_overrides(self.host, port, controller, keystore)
            conf.write_text(base + "\n# native stack overrides\n" + "\n".join(overrides) + "\n")
            if self.security.kafka_sasl:
                conf.chmod(0o600)  # it holds the broker's SASL password
            scram = self.security.scram_format_args()
            _check_scram_user(self.security, data, conf.parent / "scram-user.sha256")
            if not (data / "meta.properties").exists():
                cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
                subprocess.run(
                    # `=` form: a base64 id may start with "-", which argparse would read as an option.
                    # Transactions V1: Flink's Kafka connector (5.0) re-commits a checkpoint's transactions on
                    # recovery with the epoch it snapshotted, which V2 (an epoch bump per commit) answers with
                    # ProducerFencedException for those already committed: logged as possible data loss.
                    [java, *jvm, "-cp", classpath, "kafka.tools.StorageTool", "format", "--standalone",
                     f"--cluster-id={cluster_id}", "--feature", "transaction.version=1", "-c", str(conf), *scram],
                    check=True, capture_output=True, text=True,
                )
                if scram:  # which SASL user this storage holds (SCRAM users are created at format time)
                    write_private(conf.parent / "scram-user.sha256", self.security.credential_fingerprint())

        return Component(
            name=name,
            argv=[java, *jvm, *self._kafka_agent(metrics), "-cp", classpath, "kafka.Kafka", str(conf)],
            log=self.logs / f"{name}.log",
            ports={"broker": port, "controller": controller,
                   **({"mirror": mirror[0]} if mirror else {}),
                   **({"metrics": metrics} if metrics else {})},
            healthy=lambda: kafka_ready(bootstrap, security=self.security),
            prepare=prepare,
            on_healthy=lambda: ensure_topics(bootstrap, topics, security=self.security),
        )

    def _kafka_agent(self, port: int) -> list[str]:
        """Prometheus' JMX exporter in the broker, on a loopback port (topic rates for the dashboards)."""
        if not port:
            return []
        config = paths.stack_config("kafka/jmx-exporter.yaml")
        return [f"-javaagent:{paths.jmx_exporter_agent()}={self.host}:{port}:{config}"]

    @property
    def prometheus_base_config(self) -> Path:
        """The config docker-compose mounts; the native stack writes its own copy (``prometheus_config``)."""
        return paths.stack_config("prometheus/prometheus.yml")

    @property
    def prometheus_config(self) -> Path:
        return self.state_dir / "prometheus" / "prometheus.yml"

    def rules_dir(self) -> Path:
        """The generated rule files; with ``INFERSIGHT_SLO_FILE`` set, rules generated from that SLO file into this
        stack's state (the SLO alerts are per model: a user's own objectives, or a test's)."""
        slo_file = os.environ.get(SLO_FILE_ENV)
        if not slo_file:
            return paths.resource("infersight.dashboards", "generated/rules")
        from infersight.dashboards import generate
        from infersight.dashboards import slo as S

        out = self.state_dir / "prometheus" / "slo"
        if out.exists():
            shutil.rmtree(out)
        generate.write(out, S.load(Path(slo_file)))
        return out / "rules"

    def write_prometheus_config(self) -> None:
        """The base config with this stack's paths and ports: the generated rule files (dashboards/generated/
        rules), this stack's Alertmanager (none for a plan saved before it joined the stack) and its collectors'
        telemetry ports."""
        config = yaml.safe_load(self.prometheus_base_config.read_text())
        config["rule_files"] = [str(self.rules_dir() / "*.yml")]
        if self.ports.alertmanager:
            config["alerting"] = {"alertmanagers": [
                {"static_configs": [{"targets": [f"{self.host}:{self.ports.alertmanager}"]}]}]}
        else:
            config.pop("alerting", None)
        targets = [({"collector": "gateway", "region": r}, g.telemetry)
                   for r, g in zip(self.regions, self.ports.gateways, strict=True)]
        targets.append(({"collector": "sink", "region": "all"}, self.ports.sink_telemetry))
        for job in config.get("scrape_configs", []):
            if job["job_name"] == "otelcol":  # the same labels as compose's, on this stack's ports
                job["static_configs"] = [{"targets": [f"{self.host}:{port}"], "labels": labels}
                                         for labels, port in targets]
        if self.multi_region and self.ports.region_status:  # the region status service (schemas.region_status)
            from infersight.schemas import region_status as RS

            config.setdefault("scrape_configs", []).append({
                "job_name": RS.REGION_STATUS_JOB, "scrape_interval": "5s",
                "static_configs": [{"targets": [f"{self.host}:{self.ports.region_status}"]}]})
        if self.ports.kafka_metrics:  # the broker's JMX exporter (compose's Kafka image runs none)
            config.setdefault("scrape_configs", []).append({
                "job_name": KAFKA_SCRAPE_JOB, "scrape_interval": "15s",
                "static_configs": [{"targets": [f"{self.host}:{self.ports.kafka_metrics}"]}]})
        self.prometheus_config.parent.mkdir(parents=True, exist_ok=True)
        self.prometheus_config.write_text(f"# Written by the stack from {self.prometheus_base_config}\n"
                                          + yaml.safe_dump(config, sort_keys=False))

    def prometheus(self) -> Component:
        from infersight.stack.setup import prometheus_binary

        return Component(
            name="prometheus",
            argv=[
                str(prometheus_binary()),
                f"--config.file={self.prometheus_config}",
                f"--storage.tsdb.path={self.data / 'prometheus'}",
                f"--web.listen-address={self.host}:{self.ports.prometheus}",
                "--web.enable-remote-write-receiver",
                # the latency histograms' native form (schemas.pipeline.EXPONENTIAL_SCALE); without it 2.42 refuses
                # them and the sink's exporter retries forever, holding back every later metric
                "--enable-feature=native-histograms",
                "--storage.tsdb.retention.time=15d",
            ],
            log=self.logs / "prometheus.log",
            ports={"http": self.ports.prometheus},
            healthy=lambda: http_ok(f"{self.prometheus_url}/-/ready"),
            prepare=self.write_prometheus_config,
        )

    @property
    def alertmanager_url(self) -> str:
        return f"http://{self.host}:{self.ports.alertmanager}"

    def alertmanager(self) -> Component:
        """Debian's Alertmanager with the generated routing (dashboards/generated/alertmanager.yml), posting to
        INFERSIGHT_ALERT_WEBHOOK (default: dashboards.alertmanager.WEBHOOK)."""
        from infersight.dashboards import alertmanager as am
        from infersight.stack.setup import alertmanager_binary

        config = self.state_dir / "alertmanager" / "alertmanager.yml"

        def prepare() -> None:
            config.parent.mkdir(parents=True, exist_ok=True)
            webhook = os.environ.get("INFERSIGHT_ALERT_WEBHOOK", am.WEBHOOK)
            config.write_text(yaml.safe_dump(am.config(webhook), sort_keys=False))

        return Component(
            name="alertmanager",
            argv=[
                str(alertmanager_binary()),
                f"--config.file={config}",
                f"--storage.path={self.data / 'alertmanager'}",
                f"--web.listen-address={self.host}:{self.ports.alertmanager}",
                "--cluster.listen-address=",  # one instance: no gossip port
            ],
            log=self.logs / "alertmanager.log",
            ports={"http": self.ports.alertmanager},
            healthy=lambda: http_ok(f"{self.alertmanager_url}/-/ready"),
            prepare=prepare,
        )

    @property
    def verdicts_url(self) -> str:
        return f"http://{self.host}:{self.ports.verdicts}"

    def verdict_service(self) -> Component:
        """The canary verdict service (stack/verdict_service.py) on loopback; INFERSIGHT_VERDICT_WEBHOOK, if set,
        is POSTed on each rollout's first fail; INFERSIGHT_MLFLOW_TRACKING_URI, if set, receives each final verdict
        as an MLflow run. Plaintext Kafka only (the stack's TLS/SASL is not passed on)."""
        import sys

        webhook = os.environ.get(VERDICT_WEBHOOK_ENV, "")
        mlflow_uri = os.environ.get(MLFLOW_TRACKING_ENV, "")
        return Component(
            name="verdicts",
            argv=[sys.executable, "-m", "infersight.stack.verdict_service", "--brokers", self.kafka_bootstrap,
                  "--host", self.host, "--port", str(self.ports.verdicts),
                  *(["--webhook-url", webhook] if webhook else []),
                  *(["--mlflow-tracking-uri", mlflow_uri] if mlflow_uri else [])],
            log=self.logs / "verdicts.log",
            ports={"http": self.ports.verdicts},
            healthy=lambda: http_ok(f"{self.verdicts_url}/healthz"),
        )

    def _collector(self, name: str, config: str, health: int, telemetry: int, ports: dict[str, int],
                   env: dict[str, str]) -> Component:
        # TLS/SASL overlays merge after the base config, only when configured (stack/security.py).
        overlays = self.security.collector_overlays("gateway" if config == "gateway.yaml" else "sink")
        return Component(
            name=name,
            argv=[str(paths.otelcol_binary()),
                  *(f"--config={paths.collector_config(c)}" for c in (config, *overlays))],
            log=self.logs / f"{name}.log",
            ports={**ports, "health": health, "telemetry": telemetry},
            healthy=lambda: http_ok(f"http://{self.host}:{health}/"),
            env={
                "INFERSIGHT_KAFKA_BROKERS": self.kafka_bootstrap,
                "INFERSIGHT_HEALTH_ENDPOINT": f"{self.host}:{health}",
                "INFERSIGHT_TELEMETRY_HOST": self.host,
                "INFERSIGHT_TELEMETRY_PORT": str(telemetry),
                **self.security.collector_env(),
                **env,
            },
        )

    def gateway(self, index: int, region: str) -> Component:
        g = self.ports.gateways[index]
        return self._collector(
            f"gateway-{region}", "gateway.yaml", g.health, g.telemetry,
            {"otlp_grpc": g.otlp_grpc, "otlp_http": g.otlp_http, **({"beacon": g.beacon} if g.beacon else {})},
            {
                "INFERSIGHT_KAFKA_BROKERS": self.region_bootstrap(region),
                "INFERSIGHT_REGION": region,
                "INFERSIGHT_OTLP_GRPC_ENDPOINT": f"{self.host}:{g.otlp_grpc}",
                "INFERSIGHT_OTLP_HTTP_ENDPOINT": f"{self.host}:{g.otlp_http}",
                "INFERSIGHT_QUEUE_DIR": str(self.data / f"gateway-{region}" / "queue"),
                # its beacons' loopback receiver (collectors/gateway.yaml); a plan saved before: the default port
                **({"INFERSIGHT_BEACON_ENDPOINT": f"{self.host}:{g.beacon}"} if g.beacon else {}),
                "INFERSIGHT_MEMORY_LIMIT_MIB": str(GATEWAY_MEMORY_LIMIT_MIB),
                **GATEWAY_GO_GC,
            },
        )

    def sink(self) -> Component:
        return self._collector(
            "sink", "sink.yaml", self.ports.sink_health, self.ports.sink_telemetry,
            {"otlp_grpc": self.ports.sink_otlp} if self.ports.sink_otlp else {},
            {
                "INFERSIGHT_PROMETHEUS_URL": self.prometheus_url,
                "INFERSIGHT_SINK_OTLP_ENDPOINT": f"{self.host}:{self.ports.sink_otlp}",
                "INFERSIGHT_MEMORY_LIMIT_MIB": str(SINK_MEMORY_LIMIT_MIB),
            },
        )

    def _flink_env(self) -> dict[str, str]:
        return {
            "FLINK_CONF_DIR": str(self.flink_conf_dir),
            "FLINK_LOG_DIR": str(self.logs / "flink"),
            "FLINK_PID_DIR": str(self.state_dir / "flink-pids"),
            "FLINK_LIB_DIR": str(self.flink_lib_dir()),
            # Thread mode runs Python inside the task manager (pemja), which reads PYTHONPATH but
            # not .pth files: give it our package tree and the environment's site-packages.
            "PYTHONPATH": f"{self.python_import_root()}:{sysconfig.get_paths()['purelib']}",
        }

    def flink_lib_dir(self) -> Path:
        """pyflink's ``lib/`` plus ``opt/flink-python``, as symlinks.

        With flink-python (which holds pemja) only on each job's classpath, every thread-mode job
        after the first fails in the task manager with ``NoSuchFieldException: loadedLibraryNames``
        (pemja loads libpython once per JVM, then cannot from a second job's class loader on Java 17).
        On the cluster's own classpath, and parent-first, it is loaded once for all jobs.
        """
        home = paths.pyflink_home()
        lib = self.state_dir / "flink-lib"
        jars = [*sorted((home / "lib").glob("*.jar")), *sorted((home / "opt").glob("flink-python-*.jar"))]
        _symlink_tree(lib, {jar.name: jar for jar in jars})
        return lib

    def python_import_root(self) -> Path:
        """A folder holding ``infersight/`` as Flink's Python workers see it, made of symlinks to the sources:
        the package's ``__init__`` and the components the jobs may import (``JOB_COMPONENTS``).

        An editable install maps ``infersight.<component>`` onto top-level folders through an
        import hook registered by a .pth file; embedded interpreters skip .pth files, so they get
        this tree instead. Symlinks keep it current as the sources change. Only what the jobs stand on is
        there, so a job importing another component fails on the cluster as it fails the layering test.
        """
        import importlib

        import infersight

        root = self.state_dir / "python"
        links = {"__init__.py": Path(infersight.__file__)}
        for component in JOB_COMPONENTS:
            module = importlib.import_module(f"infersight.{component}")
            links[component] = Path(str(module.__file__)).parent
        _symlink_tree(root / "infersight", links)
        return root

    def write_flink_conf(self) -> None:
        data = self.data / "flink"
        (data / "tmp").mkdir(parents=True, exist_ok=True)
        flink_config.write_conf(self.flink_conf_dir, {
            "jobmanager.rpc.address": self.host,
            "jobmanager.rpc.port": self.ports.flink_rpc,
            "jobmanager.bind-host": self.host,
            "taskmanager.host": self.host,
            "taskmanager.bind-host": self.host,
            "rest.address": self.host,
            "rest.bind-address": self.host,
            "rest.port": self.ports.flink_rest,
            "execution.checkpointing.dir": (data / "checkpoints").as_uri(),
            "execution.checkpointing.savepoint-dir": (data / "savepoints").as_uri(),
            "io.tmp.dirs": str(data / "tmp"),
            **(flink_config.metrics_reporter(f"http://{self.host}:{self.ports.sink_otlp}")
               if self.ports.sink_otlp else {}),
        })

    def flink_jobmanager(self) -> Component:
        return Component(
            name="flink-jobmanager",
            argv=["bash", str(paths.pyflink_home() / "bin" / "jobmanager.sh"), "start-foreground"],
            log=self.logs / "flink-jobmanager.log",
            ports={"rest": self.ports.flink_rest, "rpc": self.ports.flink_rpc},
            healthy=lambda: http_ok(f"{self.flink_rest_url}/config"),
            env=self._flink_env(),
            prepare=self.write_flink_conf,
        )

    def flink_taskmanager(self, index: int = 0) -> Component:
        name = "flink-taskmanager" if index == 0 else f"flink-taskmanager-{index + 1}"

        def registered() -> bool:
            """This one, by the resource id it registers with, and alive: a task manager killed with -9 stays
            listed until the job manager's heartbeat gives up on it, but the data port it listed is closed."""
            from infersight.stack.ports import port_in_use

            listing = http_json(f"{self.flink_rest_url}/taskmanagers") or {}
            return any(tm.get("id") == name and port_in_use(self.host, int(tm.get("dataPort") or 0))
                       for tm in listing.get("taskmanagers", ()))

        return Component(
            name=name,
            argv=["bash", str(paths.pyflink_home() / "bin" / "taskmanager.sh"), "start-foreground",
                  f"-Dtaskmanager.resource-id={name}"],
            log=self.logs / f"{name}.log",
            ports={},
            healthy=registered,
            env=self._flink_env(),
        )


def _check_scram_user(security: TransportSecurity, data: Path, marker: Path) -> None:
    """Kafka creates SCRAM users only when it formats its storage: refuse to start an already formatted broker
    whose storage does not hold the configured SASL user, naming the fix."""
    if not security.kafka_sasl or not (data / "meta.properties").exists():
        return
    if not marker.exists() or marker.read_text().strip() != security.credential_fingerprint():
        from infersight.stack.errors import StackError

        raise StackError(f"this stack's Kafka storage ({data}) was formatted without the SASL user "
                         f"{security.sasl_user!r} and this password",
                         "`infersight down --wipe`, then start again: Kafka creates SCRAM users when it formats its "
                         "storage")


def _symlink_tree(folder: Path, links: dict[str, Path]) -> None:
    """Make ``folder`` hold exactly ``links`` (name -> target) as symlinks. Left alone when it already does:
    running task managers load jars and Python modules from it lazily, and every ``components()`` call (the
    supervisor's, ``status``'s) comes here."""
    try:
        current = {p.name: Path(os.readlink(p)) for p in folder.iterdir()}
    except OSError:
        current = None
    if current == links:
        return
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, target in links.items():
        (folder / name).symlink_to(target, target_is_directory=target.is_dir())


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java") or "java"

