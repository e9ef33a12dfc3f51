"""How far Prometheus' quantiles over a range are from the exact ones: native histograms against classic buckets.

A day (``--hours``) of synthetic requests in three regions (diurnal load; TTFT a lognormal body with a slow
tail and slow spells, so the p99 falls between the semconv bounds 0.1 and 0.25 s) goes through the metrics
job's own code (``WindowStats`` per 10 s window, ``Cumulative``, ``encode_window``: the OTLP batches the job
writes to ``infersight.metrics``), then through the real collector (OTLP receiver -> the sink's
``prometheusremotewrite`` exporter) into a fresh Prometheus with native histograms. Kafka and Flink are left
out: they carry these batches unchanged (the integration tests check counts and buckets through them), and the
range queries need a day of history, which the stack's sink refuses (its points older than 25 min are
dropped: Prometheus 2.42 takes no out-of-order native histogram sample).

For each range (5m, 1h, 1d), query time and quantile: ``histogram_quantile`` over ``increase(...[range])`` per
region and summed over the regions (merged, never averaged), against the exact nearest-rank quantile of the
same requests.
Writes ``bench/results/quantiles.json``: per range and quantile the largest relative error of the native
histogram (``max_rel_error``) and of the classic buckets (``classic_max_rel_error``), and the commit.

    python -m bench.quantiles            # a day: ~3 min here
    python -m bench.quantiles --quick    # two hours, 5m and 1h ranges (the CI test)
"""

from __future__ import annotations

import argparse
import json
import math
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests
import yaml

from infersight.flink_jobs.common import keys
from infersight.flink_jobs.metrics import core
from infersight.flink_jobs.metrics.window_stats import Cumulative, window_of
from infersight.schemas import metrics as M
from infersight.schemas import pipeline as P
from infersight.schemas.units import NS
from infersight.stack import paths
from infersight.stack.setup import prometheus_binary

from .results_file import save_results

RESULTS = Path(__file__).parent / "results" / "quantiles.json"
WINDOW_S = 10
REGIONS = ("us-east-1", "eu-west-1", "ap-southeast-1")
MODEL = "bench-quantiles"
RANGES_S = {"5m": 300, "1h": 3600, "1d": 86400}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
NATIVE = P.prom(M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)  # native histogram: the bare name
CLASSIC = NATIVE + "_bucket"
FEATURES = ["--enable-feature=native-histograms"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def synthetic_ttfts(hours: float, seed: int) -> dict[str, list[np.ndarray]]:
    """Per region, one array of TTFTs (s) per window: ~12 requests/window with a diurnal swing, a lognormal
    body (median 45-70 ms by region), 3 % slow tail, and spells of a few minutes where everything is 1.6x."""
    rng = np.random.default_rng(seed)
    windows = int(hours * 3600 // WINDOW_S)
    t = np.arange(windows) * WINDOW_S
    out: dict[str, list[np.ndarray]] = {}
    for r, region in enumerate(REGIONS):
        load = 12 * (1 + 0.5 * np.sin(2 * np.pi * (t / 86400 + r / 3)))
        slow = np.repeat(rng.random(windows // 30 + 1) < 0.05, 30)[:windows]  # 5-min spells
        series = []
        for w in range(windows):
            n = rng.poisson(load[w])
            body = rng.lognormal(math.log(0.045 + 0.012 * r), 0.35, n)
            tail = rng.random(n) < 0.03
            body[tail] *= rng.uniform(1.8, 3.5, tail.sum())
            series.append(body * (1.6 if slow[w] else 1.0))
        out[region] = series
    return out


def _record(region: str, ttft: float) -> dict[str, Any]:
    return {"region": region, "model": MODEL, "model_version": "v1", "track": "stable", "engine": "vllm",
            "error_type": None, "ttft_s": float(ttft), "e2e_s": float(ttft) + 0.5, "tokens_in": 32,
            "tokens_out": 24, "tokens_cached": 0}


class Receiver:
    """A fresh Prometheus (native histograms on, remote-write receiver) and the collector feeding it."""

    def __init__(self, workdir: Path) -> None:
        self.prom_port, self.otlp_port, self.health_port = _free_port(), _free_port(), _free_port()
        self.prom_url = f"http://127.0.0.1:{self.prom_port}"
        (workdir / "prometheus.yml").write_text("global: {}\n")
        collector = {
            "extensions": {"health_check": {"endpoint": f"127.0.0.1:{self.health_port}"}},
            "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{self.otlp_port}"}}}},
            "exporters": {"prometheusremotewrite": self._sink_exporter()},
            "service": {"extensions": ["health_check"], "telemetry": {"metrics": {"level": "none"}},
                        "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["prometheusremotewrite"]}}},
        }
        (workdir / "otelcol.yaml").write_text(yaml.safe_dump(collector))
        self.procs = [
            subprocess.Popen([str(prometheus_binary()), f"--config.file={workdir / 'prometheus.yml'}",
                              f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:"
                              f"{self.prom_port}", "--web.enable-remote-write-receiver",
                              *FEATURES],
                             stdout=open(workdir / "prometheus.log", "w"), stderr=subprocess.STDOUT),
            subprocess.Popen([str(paths.otelcol_binary()), f"--config={workdir / 'otelcol.yaml'}"],
                             stdout=open(workdir / "otelcol.log", "w"), stderr=subprocess.STDOUT),
        ]
        self._wait(f"{self.prom_url}/-/ready")
        self._wait(f"http://127.0.0.1:{self.health_port}/")

    def _sink_exporter(self) -> dict[str, Any]:
        """The stack's sink exporter settings (collectors/sink.yaml), pointed at this Prometheus."""
        exporter = yaml.safe_load(paths.collector_config("sink.yaml").read_text())["exporters"]["prometheusremotewrite"]
        return {**exporter, "endpoint": f"{self.prom_url}/api/v1/write"}

    @staticmethod
    def _wait(url: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if requests.get(url, timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{url} did not come up in {timeout_s:.0f} s")

    def send(self, session: requests.Session, payload: bytes) -> None:
        resp = session.post(f"http://127.0.0.1:{self.otlp_port}/v1/metrics", data=payload, timeout=30,
                            headers={"Content-Type": "application/x-protobuf"})
        resp.raise_for_status()

    def quantile(self, query: str, at_s: float) -> dict[str, float]:
        resp = requests.get(f"{self.prom_url}/api/v1/query", params={"query": query, "time": at_s}, timeout=30)
        resp.raise_for_status()
        return {r["metric"].get("region", "all"): float(r["value"][1]) for r in resp.json()["data"]["result"]}

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(30)


def feed(receiver: Receiver, ttfts: dict[str, list[np.ndarray]], t0_s: int) -> None:
    """Each window of each region as the metrics job encodes it, in time order (native histograms take no
    out-of-order sample)."""
    session = requests.Session()
    totals = {region: Cumulative(t0_s * NS) for region in REGIONS}
    for w in range(len(ttfts[REGIONS[0]])):
        end_ns = (t0_s + (w + 1) * WINDOW_S) * NS
        for region in REGIONS:
            records = [_record(region, v) for v in ttfts[region][w]]
            if not records:
                continue
            stats = window_of(records)
            totals[region].add_window(stats)
            receiver.send(session, core.encode_window(keys.series_key(records[0]), end_ns, stats, totals[region]))


def measure(receiver: Receiver, ttfts: dict[str, list[np.ndarray]], t0_s: int, ranges: dict[str, int],
            every_s: dict[str, int]) -> dict[str, Any]:
    windows = len(ttfts[REGIONS[0]])
    end_s = t0_s + windows * WINDOW_S
    out: dict[str, Any] = {}
    for name, range_s in ranges.items():
        cells: dict[str, dict[str, float]] = {q: {"native": 0.0, "classic": 0.0} for q in QUANTILES}
        worst: dict[str, Any] = {}
        times = list(range(end_s, t0_s + range_s - 1, -every_s[name]))
        for at in times:
            first = (at - range_s - t0_s) // WINDOW_S  # windows ending in (at - range, at]
            last = (at - t0_s) // WINDOW_S
            exact_sets = {region: np.concatenate(ttfts[region][first:last]) for region in REGIONS}
            exact_sets["all"] = np.concatenate(list(exact_sets.values()))
            sel = f'{{model="{MODEL}"}}[{range_s}s]'
            for label, q in QUANTILES.items():
                native = {
                    **receiver.quantile(f"histogram_quantile({q}, sum by (region) (increase({NATIVE}{sel})))", at),
                    **receiver.quantile(f"histogram_quantile({q}, sum(increase({NATIVE}{sel})))", at)}
                classic = {**receiver.quantile(
                    f"histogram_quantile({q}, sum by (le, region) (increase({CLASSIC}{sel})))", at),
                    **receiver.quantile(f"histogram_quantile({q}, sum by (le) (increase({CLASSIC}{sel})))", at)}
                for who, values in exact_sets.items():
                    # nearest rank: the smallest value with at least q of the requests at or below it (what a
                    # histogram estimates; numpy's default interpolates between two order statistics, which in a
                    # sparse tail can lie a few % from both)
                    exact = float(np.quantile(values, q, method="inverted_cdf"))
                    for kind, got in (("native", native), ("classic", classic)):
                        if who not in got:
                            raise AssertionError(f"{kind} {label} over {name} at {at} for {who}: no answer")
                        err = abs(got[who] - exact) / exact
                        if err > cells[label][kind]:
                            cells[label][kind] = err
                            if kind == "native":
                                worst[label] = {"at": at, "who": who, "exact": exact, "prometheus": got[who]}
        out[name] = {label: {"max_rel_error": round(c["native"], 5), "classic_max_rel_error": round(c["classic"], 5),
                             "worst": worst.get(label)} for label, c in cells.items()}
        out[name]["query_times"] = len(times)
        print(f"{name}: " + ", ".join(f"{label} native {c['native']:.2%} classic {c['classic']:.2%}"
                                      for label, c in cells.items()), flush=True)
    return out


def run(hours: float, ranges: dict[str, int], seed: int = 7) -> dict[str, Any]:
    ttfts = synthetic_ttfts(hours, seed)
    t0_s = (int(time.time()) - int(hours * 3600) - 120) // WINDOW_S * WINDOW_S
    every_s = {"5m": max(300, int(hours * 3600) // 24), "1h": max(3600, int(hours * 3600) // 8), "1d": 86400}
    with tempfile.TemporaryDirectory(prefix="infersight-quantiles-") as tmp:
        receiver = Receiver(Path(tmp))
        try:
            started = time.monotonic()
            feed(receiver, ttfts, t0_s)
            fed_s = time.monotonic() - started
            result = measure(receiver, ttfts, t0_s, ranges, every_s)
        finally:
            receiver.close()
    return {"hours": hours, "requests": int(sum(len(w) for s in ttfts.values() for w in s)),
            "regions": len(REGIONS), "window_s": WINDOW_S, "scale": P.EXPONENTIAL_SCALE, "feed_s": round(fed_s, 1),
            **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two hours, 5m and 1h ranges; no results file")
    args = parser.parse_args()
    if args.quick:
        print(json.dumps(run(2, {k: RANGES_S[k] for k in ("5m", "1h")}), indent=2))
        return
    save_results(RESULTS, run(24, RANGES_S))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
