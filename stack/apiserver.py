"""A real Kubernetes API server on loopback for server-side dry runs (``deploy/check.py``): kube-apiserver
and kubectl built from the Go module proxy, etcd from Debian's ``etcd-server`` package, all cached.

Nothing can be scheduled (no controllers, no kubelet, no images); what it gives is the real admission and
the real schemas: with the CRDs applied, ``kubectl apply --dry-run=server`` refuses an unknown field, a bad
enum or a wrong type as a cluster would. Both processes are stopped by PID.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from infersight.stack import paths, setup
from infersight.stack.errors import StackError

KUBERNETES = "1.37.2"
STAGING = "0.37.2"  # k8s.io/kubernetes' ./staging modules, as the Go module proxy serves them
TOKEN = "infersight-dry-run"


def _dir() -> Path:
    return paths.cache_dir() / "deploy"


def _go_env() -> dict[str, str]:
    go = paths.go_dir()
    return {"GOMODCACHE": str(go / "mod"), "GOCACHE": str(go / "build"), "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}


def ensure_binaries() -> dict[str, Path]:
    """kube-apiserver and kubectl (``go build`` of a module requiring k8s.io/kubernetes with its staging
    replaces pointed at the proxy's modules: long the first time), and etcd."""
    bin_dir = _dir() / f"kube-{KUBERNETES}-bin"
    out = {"kube-apiserver": bin_dir / "kube-apiserver", "kubectl": bin_dir / "kubectl", "etcd": ensure_etcd()}
    if out["kube-apiserver"].exists() and out["kubectl"].exists():
        return out
    go = shutil.which("go")
    if not go:
        raise StackError("`go` is not installed", "install Go 1.26+ (https://go.dev/doc/install)")
    src = _dir() / f"kube-{KUBERNETES}-src"
    src.mkdir(parents=True, exist_ok=True)
    setup._run([go, "mod", "download", "-json", f"k8s.io/kubernetes@v{KUBERNETES}"], "go mod download kubernetes",
               "check that the Go module proxy is reachable, then rerun", env=_go_env(), cwd=src)
    upstream = (paths.go_dir() / "mod" / "cache" / "download" / "k8s.io" / "kubernetes" / "@v"
                / f"v{KUBERNETES}.mod").read_text()
    replaces = [line.split()[0] for line in upstream.splitlines() if "=> ./staging" in line]
    (src / "go.mod").write_text("module infersight.io/kube\n\ngo 1.26.0\n\n"
                                f"require k8s.io/kubernetes v{KUBERNETES}\n\n"
                                + "".join(f"replace {m} => {m} v{STAGING}\n" for m in replaces))
    setup.log(f"deploy check: building kube-apiserver and kubectl {KUBERNETES} (first time: many minutes) ...")
    setup._run(["nice", "-n", "19", go, "build", "-o", f"{bin_dir}/", "k8s.io/kubernetes/cmd/kube-apiserver",
                "k8s.io/kubernetes/cmd/kubectl"], "go build kube-apiserver/kubectl", "see the log",
               env=_go_env(), cwd=src)
    return out


def ensure_etcd() -> Path:
    target = _dir() / "etcd-server"
    binary = target / "usr" / "bin" / "etcd"
    if not binary.exists():
        setup._debian_package("etcd-server", target, "install etcd 3.4+ so `etcd` is on PATH, then rerun")
    return binary


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class ApiServer:
    """``with ApiServer(binaries) as api: api.kubectl(...)``: etcd + kube-apiserver in a temp folder."""

    def __init__(self, binaries: dict[str, Path], start_timeout_s: float = 60) -> None:
        self.bin = binaries
        self.timeout_s = start_timeout_s
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> ApiServer:
        self.tmp = Path(tempfile.mkdtemp(prefix="infersight-apiserver-"))
        client, peer, secure = _free_ports(3)
        self.url = f"https://127.0.0.1:{secure}"
        (self.tmp / "tokens.csv").write_text(f"{TOKEN},dry-run,dry-run,system:masters\n")
        subprocess.run(["openssl", "genrsa", "-out", str(self.tmp / "sa.key"), "2048"], check=True,
                       capture_output=True)
        logs = self.tmp / "logs"
        logs.mkdir()
        try:
            self._start([str(self.bin["etcd"]), "--data-dir", str(self.tmp / "etcd"),
                         "--listen-client-urls", f"http://127.0.0.1:{client}",
                         "--advertise-client-urls", f"http://127.0.0.1:{client}",
                         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                         "--initial-cluster", f"default=http://127.0.0.1:{peer}"], logs / "etcd.log")
            self._start([str(self.bin["kube-apiserver"]), f"--etcd-servers=http://127.0.0.1:{client}",
                         "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={secure}",
                         "--endpoint-reconciler-type=none", f"--token-auth-file={self.tmp / 'tokens.csv'}",
                         "--authorization-mode=AlwaysAllow", f"--cert-dir={self.tmp / 'certs'}",
                         "--service-account-issuer=https://kubernetes.default.svc",
                         f"--service-account-key-file={self.tmp / 'sa.key'}",
                         f"--service-account-signing-key-file={self.tmp / 'sa.key'}",
                         "--service-cluster-ip-range=10.96.0.0/16"], logs / "kube-apiserver.log")
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, cmd: list[str], log: Path) -> None:
        with open(log, "w") as out:
            self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

    def _wait_ready(self) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # its own self-signed cert, on loopback
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise StackError(f"{p.args[0]} exited ({p.returncode}); see {self.tmp / 'logs'}",
                                     "read its log")
            try:
                req = urllib.request.Request(f"{self.url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"})
                with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise StackError(f"kube-apiserver not ready in {self.timeout_s:.0f} s; see {self.tmp / 'logs'}",
                         "read its log")

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin["kubectl"]), f"--server={self.url}", f"--token={TOKEN}",
                               "--insecure-skip-tls-verify", *args], capture_output=True, text=True, input=stdin)

    def __exit__(self, *exc) -> None:
        for p in reversed(self.procs):  # by PID, apiserver first
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)
