"""Idempotent set-up of everything the stack runs: Kafka and Flink jars (Maven), the otelcol
build (OpenTelemetry Collector Builder), Prometheus and Alertmanager (Debian's packages).

Each step checks its cache first, prints what it does, and ends with a StackError naming the
problem and the fix when a prerequisite is missing. The Python environment itself is made by
``bin/infersight`` before this module can run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

from infersight.stack import paths
from infersight.stack.errors import StackError

MIN_FREE_DISK_GIB = 3


def log(msg: str) -> None:
    print(f"[setup] {msg}", flush=True)


def ensure_all() -> float:
    """Everything the stack needs; returns seconds spent."""
    t0 = time.monotonic()
    _check_disk()
    _require("java", "install a JDK 17+ (Debian: `apt-get install openjdk-17-jre-headless`)")
    ensure_jars()
    ensure_otelcol()
    ensure_prometheus()
    ensure_alertmanager()
    return time.monotonic() - t0


def _check_disk() -> None:
    cache = paths.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    free_gib = shutil.disk_usage(cache).free / 2**30
    if free_gib < MIN_FREE_DISK_GIB:
        raise StackError(f"only {free_gib:.1f} GiB free on the disk holding {cache}",
                         f"free at least {MIN_FREE_DISK_GIB} GiB, or point INFERSIGHT_CACHE at a larger disk")


def _require(tool: str, fix: str) -> str:
    found = shutil.which(tool)
    if not found:
        raise StackError(f"`{tool}` is not installed (or not on PATH)", fix)
    return found


def _run(cmd: list[str], what: str, fix: str, env: dict[str, str] | None = None, cwd: Path | None = None,
         log_file: Path | None = None) -> None:
    """Run a set-up tool, printing a heartbeat so long builds show progress; raise StackError on failure."""
    log_file = log_file or paths.cache_dir() / "logs" / f"{cmd[0].rsplit('/', 1)[-1]}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_file, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                cwd=cwd, stdin=subprocess.DEVNULL)
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(20):
                log(f"  ... {what}: {time.monotonic() - t0:.0f} s")

        threading.Thread(target=heartbeat, daemon=True).start()
        rc = proc.wait()
        done.set()
    if rc != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-12:])
        offline = any(s in tail for s in ("Could not transfer", "no such host", "dial tcp", "Temporary failure",
                                          "Connection refused", "Network is unreachable", "403 Forbidden"))
        problem = f"{what} failed (exit {rc}); last lines of {log_file}:\n{tail}"
        if offline:
            fix = "the package registry could not be reached or refused a download: check the network, then rerun"
        raise StackError(problem, fix)


# -- JVM artifacts ---------------------------------------------------------------------------

def ensure_jars() -> None:
    kafka_jar = paths.kafka_classpath_dir() / f"kafka_2.13-{paths.KAFKA_VERSION}.jar"
    downloaded = [kafka_jar, *paths.flink_job_jars(), paths.jmx_exporter_agent()]
    downloaded.remove(paths.watermarks_jar())
    if all(jar.exists() for jar in downloaded):
        log("JVM artifacts: cached")
    else:
        download_jars()
    ensure_watermarks_jar()
    ensure_mirror_jars()


def ensure_mirror_jars() -> None:
    """MirrorMaker 2's classpath (the multi-region topology), fetched by every set-up like the broker's."""
    jar = paths.mirror_classpath_dir() / f"connect-mirror-{paths.MIRROR_KAFKA_VERSION}.jar"
    if jar.exists():
        return
    mvn = _require("mvn", "install Maven 3.8+ (Debian: `apt-get install maven`)")
    log(f"JVM artifacts: MirrorMaker 2 (connect-mirror {paths.MIRROR_KAFKA_VERSION}) from Maven Central ...")
    _run([mvn, "-B", "-q", "-f", str(paths.resource("infersight.stack", "pom.xml")),
          f"-Dinfersight.jars={paths.jars_dir()}",
          f"-Dmaven.repo.local={paths.cache_dir() / 'm2'}",
          f"-DbuildDirectory={paths.cache_dir() / 'maven-build'}",
          "-P", "mirror", "dependency:copy-dependencies@mirror"],
         "Maven download (MirrorMaker 2)", "check that Maven Central is reachable, then rerun")


def ensure_watermarks_jar() -> None:
    """Compile the jobs' watermark strategy against the Flink that PyFlink carries (javac, from a JDK)."""
    import tempfile
    import zipfile

    jar = paths.watermarks_jar()
    if jar.exists():
        return
    javac = _require("javac", "install a JDK 11+ (Debian: `apt-get install openjdk-17-jdk-headless`)")
    flink = sorted((paths.pyflink_home() / "lib").glob("flink-dist-*.jar"))
    if not flink:
        raise StackError(f"no flink-dist jar in {paths.pyflink_home() / 'lib'}", "reinstall apache-flink")
    with tempfile.TemporaryDirectory() as out:
        _run([javac, "--release", "11", "-nowarn", "-cp", str(flink[-1]), "-d", out, str(paths.watermarks_source())],
             "compiling the watermark strategy", "see the javac error above")
        jar.parent.mkdir(parents=True, exist_ok=True)
        part = jar.with_suffix(".part")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for cls in sorted(Path(out).rglob("*.class")):
                z.write(cls, cls.relative_to(out).as_posix())
        part.replace(jar)
    log(f"watermark strategy: built {jar.name}")


def download_jars() -> None:
    mvn = _require("mvn", "install Maven 3.8+ (Debian: `apt-get install maven`)")
    log(f"JVM artifacts: Kafka {paths.KAFKA_VERSION} and the Flink Kafka connector "
        f"{paths.FLINK_KAFKA_CONNECTOR_VERSION} from Maven Central ...")
    _run([mvn, "-B", "-q", "-f", str(paths.resource("infersight.stack", "pom.xml")),
          f"-Dinfersight.jars={paths.jars_dir()}",
          f"-Dmaven.repo.local={paths.cache_dir() / 'm2'}",
          f"-DbuildDirectory={paths.cache_dir() / 'maven-build'}",
          "dependency:copy-dependencies@kafka", "dependency:copy@flink", "dependency:copy@agents"],
         "Maven download", "check that Maven Central is reachable, then rerun")
    log(f"JVM artifacts: done ({paths.jars_dir()})")


# -- otelcol ---------------------------------------------------------------------------------

def otelcol_manifest_digest() -> str:
    manifest = paths.collector_config("builder-config.yaml").read_bytes()
    return hashlib.sha256(manifest).hexdigest()[:16]


def ensure_otelcol() -> None:
    binary = paths.otelcol_binary()
    stamp = binary.with_suffix(".manifest-sha")
    digest = otelcol_manifest_digest()
    if binary.exists() and stamp.exists() and stamp.read_text() == digest:
        log("otelcol: cached")
        return
    go = _require("go", "install Go 1.24+ (https://go.dev/doc/install or Debian's golang package)")
    gocache = paths.go_dir()
    env = {
        "GOBIN": str(gocache / "bin"),
        "GOMODCACHE": str(gocache / "mod"),
        "GOCACHE": str(gocache / "build"),
        "GOFLAGS": "-mod=mod",
        "CGO_ENABLED": "0",
    }
    builder = gocache / "bin" / "builder"
    builder_stamp = gocache / "bin" / "builder.version"
    if not (builder.exists() and builder_stamp.exists()
            and builder_stamp.read_text() == paths.OTELCOL_BUILDER_VERSION):
        log(f"otelcol: installing the Collector Builder {paths.OTELCOL_BUILDER_VERSION} ...")
        _run([go, "install", f"go.opentelemetry.io/collector/cmd/builder@{paths.OTELCOL_BUILDER_VERSION}"],
             "go install builder", "check that the Go module proxy is reachable, then rerun", env=env)
        builder_stamp.write_text(paths.OTELCOL_BUILDER_VERSION)
    out_dir = paths.cache_dir() / "otelcol" / "build"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)  # the builder creates only the last folder
    log("otelcol: building from collectors/builder-config.yaml (first time: several minutes) ...")
    _run([str(builder), f"--config={paths.collector_config('builder-config.yaml')}",
          f"--output-path={out_dir}"],
         "otelcol build", "see the log; the Go module proxy must be reachable", env=env)
    binary.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(out_dir / "otelcol-infersight", binary)
    stamp.write_text(digest)
    log(f"otelcol: built {binary}")


# -- Prometheus ------------------------------------------------------------------------------

def prometheus_binary() -> Path:
    cached = paths.prometheus_dir() / "usr" / "bin" / "prometheus"
    if cached.exists():
        return cached
    found = shutil.which("prometheus")
    if found:
        return Path(found)
    return cached


def ensure_prometheus() -> None:
    if prometheus_binary().exists():
        log(f"Prometheus: found {prometheus_binary()}")
        return
    _debian_package("prometheus", paths.prometheus_dir(), "install Prometheus 2.42+ (your package manager, "
                    "or the release tarball) so `prometheus` is on PATH, then rerun")
    log(f"Prometheus: {prometheus_binary()}")


def _debian_package(package: str, target: Path, no_apt_fix: str) -> None:
    """Debian's package unpacked into ``target`` (apt-get download + dpkg-deb -x: no system service, no root
    needed when the package lists are fresh)."""
    apt = shutil.which("apt-get")
    if not apt:
        raise StackError(f"{package} is not installed and this machine has no apt-get", no_apt_fix)
    log(f"{package}: fetching Debian's package (unpacked into the cache; no system service) ...")
    debs = paths.cache_dir() / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    fix = "run `apt-get update` as root and check that Debian's mirror is reachable, then rerun"
    try:
        _run([apt, "download", package], f"apt-get download {package}", fix, cwd=debs)
    except StackError:
        if os.geteuid() != 0:
            raise
        _run([apt, "update", "-qq"], "apt-get update", fix)
        _run([apt, "download", package], f"apt-get download {package}", fix, cwd=debs)
    deb = sorted(debs.glob(f"{package}_*.deb"))[-1]
    shutil.rmtree(target, ignore_errors=True)
    _run(["dpkg-deb", "-x", str(deb), str(target)], f"unpacking {package}", fix)


# -- Alertmanager (Debian's prometheus-alertmanager 0.25, with amtool) ------------------------------------------

def alertmanager_binary() -> Path:
    cached = paths.alertmanager_dir() / "usr" / "bin" / "prometheus-alertmanager"
    if cached.exists():
        return cached
    found = shutil.which("alertmanager") or shutil.which("prometheus-alertmanager")
    return Path(found) if found else cached


# Debian's build reads its notification templates from this fixed path (no flag moves it): without them it
# rejects every config ("failed to parse templates").
ALERTMANAGER_TEMPLATES = Path("/usr/share/prometheus/alertmanager")


def ensure_alertmanager() -> None:
    if alertmanager_binary().exists():
        log(f"Alertmanager: found {alertmanager_binary()}")
    else:
        _debian_package("prometheus-alertmanager", paths.alertmanager_dir(), "install Alertmanager 0.25+ (your "
                        "package manager, or the release tarball) so `alertmanager` is on PATH, then rerun")
        log(f"Alertmanager: {alertmanager_binary()}")
    if not alertmanager_binary().is_relative_to(paths.alertmanager_dir()):
        return  # an installed Alertmanager brings its own templates
    shipped = paths.alertmanager_dir() / ALERTMANAGER_TEMPLATES.relative_to("/")
    missing = [t for t in sorted(shipped.glob("*.tmpl")) if not (ALERTMANAGER_TEMPLATES / t.name).exists()]
    if not missing:
        return
    try:  # the package's own files, where the package would put them
        ALERTMANAGER_TEMPLATES.mkdir(parents=True, exist_ok=True)
        for t in missing:
            shutil.copyfile(t, ALERTMANAGER_TEMPLATES / t.name)
    except OSError as exc:
        raise StackError(f"Debian's Alertmanager needs its templates in {ALERTMANAGER_TEMPLATES} ({exc})",
                         f"copy {shipped}/*.tmpl there as root (or install prometheus-alertmanager), then rerun"
                         ) from None
    log(f"Alertmanager: templates copied to {ALERTMANAGER_TEMPLATES}")
