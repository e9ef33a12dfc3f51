"""Transport security as an option: TLS (or mutual TLS) on the gateways' OTLP receivers, and TLS + SASL/SCRAM
between every Kafka client (collectors, Flink jobs, our tools) and the broker. Off by default: with none of
the variables below set, nothing here changes a command, a config file or an environment, and the stack
stays as it is, bound to loopback. ``docs/security.md`` says what each mode protects.

Settings, from the environment (set the same ones for every ``infersight`` command of a stack):

``INFERSIGHT_TLS_DIR``
    A folder of PEM files: ``server.pem`` and ``server-key.pem`` (unencrypted PKCS#8), the certificate the
    gateways' OTLP receivers and the Kafka broker present, whose SANs must name the addresses clients dial;
    ``ca.pem``, the CA that signed it (Kafka clients verify the broker against it); and, optionally,
    ``client-ca.pem``: when present, a gateway accepts only OTLP clients presenting a certificate that this
    CA signed (mutual TLS). Set alone: OTLP over TLS, Kafka unchanged.
``INFERSIGHT_KAFKA_SASL_USER``, ``INFERSIGHT_KAFKA_SASL_PASSWORD`` (with ``INFERSIGHT_TLS_DIR``)
    Kafka over SASL_SSL: the broker's client listener takes TLS and SCRAM only, and every client
    authenticates as this user. The native stack creates the user when it formats Kafka's storage.
``INFERSIGHT_KAFKA_SASL_MECHANISM``
    ``SCRAM-SHA-512`` (default) or ``SCRAM-SHA-256``.

The collectors read their part through the variables of ``COLLECTOR_ENV`` (the overlays' interface, the same
in docker-compose and in a deployment), the jobs through a Kafka client properties file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from infersight.stack.errors import StackError

ENV_TLS_DIR = "INFERSIGHT_TLS_DIR"
ENV_SASL_USER = "INFERSIGHT_KAFKA_SASL_USER"
ENV_SASL_PASSWORD = "INFERSIGHT_KAFKA_SASL_PASSWORD"
ENV_SASL_MECHANISM = "INFERSIGHT_KAFKA_SASL_MECHANISM"
# What the collector overlays read (collectors/*-tls.yaml, *-sasl.yaml).
ENV_OTLP_TLS_CERT = "INFERSIGHT_OTLP_TLS_CERT"
ENV_OTLP_TLS_KEY = "INFERSIGHT_OTLP_TLS_KEY"
ENV_OTLP_TLS_CLIENT_CA = "INFERSIGHT_OTLP_TLS_CLIENT_CA"
ENV_KAFKA_TLS_CA = "INFERSIGHT_KAFKA_TLS_CA"
COLLECTOR_ENV = (ENV_OTLP_TLS_CERT, ENV_OTLP_TLS_KEY, ENV_OTLP_TLS_CLIENT_CA, ENV_KAFKA_TLS_CA,
                 ENV_SASL_USER, ENV_SASL_PASSWORD, ENV_SASL_MECHANISM)

# Files of INFERSIGHT_TLS_DIR.
CA_FILE = "ca.pem"
SERVER_CERT_FILE = "server.pem"
SERVER_KEY_FILE = "server-key.pem"
CLIENT_CA_FILE = "client-ca.pem"

# Collector config overlays, merged after the base config (``--config=gateway.yaml --config=<overlay>``).
GATEWAY_OTLP_TLS = "gateway-otlp-tls.yaml"
GATEWAY_OTLP_MTLS = "gateway-otlp-mtls.yaml"
GATEWAY_KAFKA_SASL = "gateway-kafka-sasl.yaml"
SINK_KAFKA_SASL = "sink-kafka-sasl.yaml"

SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
SASL_SSL = "SASL_SSL"
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
# flink-sql-connector-kafka (the fat jar the jobs ship) relocates kafka-clients under this package, and JAAS
# loads its login module by class name: the unrelocated name fails there with "No LoginModule found".
FLINK_SHADED_PREFIX = "org.apache.flink.kafka.shaded."
# Characters that would break the JAAS line, the broker's properties file or kafka-storage's --add-scram.
_UNSAFE = set('"\\,[]\n\r\t ')


@dataclass(frozen=True)
class TransportSecurity:
    """The stack's transport security settings; ``TransportSecurity()`` is the default: none."""

    tls_dir: Path | None = None
    sasl_user: str | None = None
    sasl_password: str | None = None
    sasl_mechanism: str = SCRAM_MECHANISMS[0]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TransportSecurity:
        env = os.environ if environ is None else environ
        tls_dir = env.get(ENV_TLS_DIR, "").strip()
        user = env.get(ENV_SASL_USER, "").strip()
        password = env.get(ENV_SASL_PASSWORD, "")
        mechanism = env.get(ENV_SASL_MECHANISM, "").strip().upper() or SCRAM_MECHANISMS[0]
        security = cls(Path(tls_dir).resolve() if tls_dir else None, user or None, password or None, mechanism)
        security.validate()
        return security

    def validate(self) -> None:
        if self.tls_dir is not None:
            missing = [n for n in (CA_FILE, SERVER_CERT_FILE, SERVER_KEY_FILE) if not (self.tls_dir / n).is_file()]
            if missing:
                raise StackError(f"{ENV_TLS_DIR}={self.tls_dir} lacks {', '.join(missing)}",
                                 f"put the PEM files there ({CA_FILE}, {SERVER_CERT_FILE}, {SERVER_KEY_FILE}, "
                                 f"optionally {CLIENT_CA_FILE}; docs/security.md), or unset {ENV_TLS_DIR}")
        if bool(self.sasl_user) != bool(self.sasl_password):
            raise StackError(f"only one of {ENV_SASL_USER} and {ENV_SASL_PASSWORD} is set",
                             "set both (Kafka over SASL_SSL) or neither")
        if self.sasl_user:
            if self.tls_dir is None:
                raise StackError(f"{ENV_SASL_USER} is set without {ENV_TLS_DIR}",
                                 f"set {ENV_TLS_DIR} too: Kafka credentials travel only over TLS (SASL_SSL)")
            if self.sasl_mechanism not in SCRAM_MECHANISMS:
                raise StackError(f"{ENV_SASL_MECHANISM}={self.sasl_mechanism} is not supported",
                                 f"use one of {', '.join(SCRAM_MECHANISMS)}")
            bad = sorted(_UNSAFE & set(f"{self.sasl_user}{self.sasl_password}"))
            if bad:
                raise StackError(f"the Kafka SASL user or password contains {bad!r}",
                                 "pick a user name and password without quotes, backslashes, commas, brackets "
                                 "or white space")

    # -- what is on ------------------------------------------------------------------------------

    @property
    def otlp_tls(self) -> bool:
        return self.tls_dir is not None

    @property
    def otlp_mtls(self) -> bool:
        return self.tls_dir is not None and (self.tls_dir / CLIENT_CA_FILE).is_file()

    @property
    def kafka_sasl(self) -> bool:
        return self.sasl_user is not None

    def _file(self, name: str) -> Path:
        assert self.tls_dir is not None
        return self.tls_dir / name

    @property
    def ca(self) -> Path:
        return self._file(CA_FILE)

    @property
    def server_cert(self) -> Path:
        return self._file(SERVER_CERT_FILE)

    @property
    def server_key(self) -> Path:
        return self._file(SERVER_KEY_FILE)

    @property
    def client_ca(self) -> Path:
        return self._file(CLIENT_CA_FILE)

    # -- collectors --------------------------------------------------------------------------------

    def collector_overlays(self, role: str) -> list[str]:
        """Config files merged after the base config of a ``gateway`` or the ``sink``, in order."""
        overlays = []
        if role == "gateway" and self.otlp_tls:
            overlays.append(GATEWAY_OTLP_TLS)
            if self.otlp_mtls:
                overlays.append(GATEWAY_OTLP_MTLS)
        if self.kafka_sasl:
            overlays.append(GATEWAY_KAFKA_SASL if role == "gateway" else SINK_KAFKA_SASL)
        return overlays

    def collector_env(self) -> dict[str, str]:
        """The variables the overlays read."""
        env: dict[str, str] = {}
        if self.otlp_tls:
            env |= {ENV_OTLP_TLS_CERT: str(self.server_cert), ENV_OTLP_TLS_KEY: str(self.server_key)}
            if self.otlp_mtls:
                env[ENV_OTLP_TLS_CLIENT_CA] = str(self.client_ca)
        if self.kafka_sasl:
            env |= {ENV_KAFKA_TLS_CA: str(self.ca), ENV_SASL_USER: str(self.sasl_user),
                    ENV_SASL_PASSWORD: str(self.sasl_password), ENV_SASL_MECHANISM: self.sasl_mechanism}
        return env

    # -- Kafka clients -----------------------------------------------------------------------------

    def librdkafka_config(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) settings; empty when Kafka security is off."""
        if not self.kafka_sasl:
            return {}
        return {"security.protocol": SASL_SSL, "sasl.mechanisms": self.sasl_mechanism,
                "sasl.username": str(self.sasl_user), "sasl.password": str(self.sasl_password),
                "ssl.ca.location": str(self.ca)}

    def jaas_config(self, shaded: bool = False) -> str:
        module = (FLINK_SHADED_PREFIX if shaded else "") + SCRAM_LOGIN_MODULE
        return f'{module} required username="{self.sasl_user}" password="{self.sasl_password}";'

    def java_client_properties(self, shaded: bool = True) -> dict[str, str]:
        """Java Kafka client settings; ``shaded``: for the Flink connector's relocated client (what the jobs
        use). The truststore is a path: it must exist where the task managers run."""
        if not self.kafka_sasl:
            return {}
        return {"security.protocol": SASL_SSL, "sasl.mechanism": self.sasl_mechanism,
                "sasl.jaas.config": self.jaas_config(shaded),
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca)}

    # -- the native broker -------------------------------------------------------------------------

    def broker_overrides(self, host: str, port: int, controller_port: int, keystore: Path) -> list[str]:
        """server.properties lines for a single combined-mode node whose client (and inter-broker) listener is
        SASL_SSL; the controller listener stays PLAINTEXT on ``host`` (loopback in the native stack)."""
        listener = SASL_SSL.lower()
        mechanism = self.sasl_mechanism
        return [
            f"listeners={SASL_SSL}://{host}:{port},CONTROLLER://{host}:{controller_port}",
            f"advertised.listeners={SASL_SSL}://{host}:{port}",
            f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{SASL_SSL}:{SASL_SSL}",
            f"inter.broker.listener.name={SASL_SSL}",
            f"sasl.enabled.mechanisms={mechanism}",
            f"sasl.mechanism.inter.broker.protocol={mechanism}",
            f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config={self.jaas_config()}",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.ca}",
            "ssl.client.auth=none",
        ]

    def keystore_pem(self) -> str:
        """The broker's PEM keystore: its private key, then its certificate chain (Kafka's PEM file layout)."""
        key = self.server_key.read_text()
        if "-----BEGIN PRIVATE KEY-----" not in key:
            raise StackError(f"{self.server_key} is not an unencrypted PKCS#8 key, which Kafka's PEM keystore needs",
                             f"convert it: openssl pkcs8 -topk8 -nocrypt -in {self.server_key} -out <new file>")
        return key.rstrip() + "\n" + self.server_cert.read_text().rstrip() + "\n"

    def scram_format_args(self) -> list[str]:
        """kafka-storage ``format`` arguments that create the SASL user with the storage (KRaft)."""
        if not self.kafka_sasl:
            return []
        return ["--add-scram", f'{self.sasl_mechanism}=[name={self.sasl_user},password={self.sasl_password}]']

    def credential_fingerprint(self) -> str:
        """A digest of mechanism, user and password: which credential a formatted storage holds."""
        return hashlib.sha256(f"{self.sasl_mechanism}\0{self.sasl_user}\0{self.sasl_password}".encode()).hexdigest()


def write_private(path: Path, text: str) -> Path:
    """Write a file only its owner can read (it holds a key or a password)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)
    return path


def java_properties_text(props: Mapping[str, str]) -> str:
    """``key=value`` lines (values as they are: none of ours holds a backslash or a line break)."""
    return "".join(f"{k}={v}\n" for k, v in props.items())
