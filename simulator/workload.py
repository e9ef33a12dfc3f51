"""One tick of the virtual fleet: who got how many requests, and each request's timeline, drawn with
numpy over the whole tick at once (a Python loop per request could not offer 30K requests/s).

Deterministic: tick ``k`` of seed ``s`` draws from ``default_rng([s, k])``, whatever the pacing.

The model, per pod: Poisson arrivals at the group's rate x the diurnal curve; M/M/1-like queueing
(a request waits with probability rho, then Exp(mu - lambda)), so queues grow with load; lognormal
prefill that grows with prompt length and shrinks with prefix-cache hits; lognormal inter-token gaps;
Pareto (heavy-tailed) output lengths; errors and timeouts. A request's ITL gaps are a step function
at its p50/p90/p99/max (``decode_ns`` is their exact sum), so the summary our SDK would compute from
the same gaps is exactly the one encoded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from infersight.schemas.units import NS
from infersight.simulator.fleet import FleetSpec, ModelSpec, RegionSpec

TRACK_NAMES = ("stable", "canary")
ERROR_TYPES = ("EngineGenerateError", "context_length_exceeded", "500")
TIMEOUT_S = 30.0
POD_DOWN_ERROR = "EngineDeadError"


@dataclass(frozen=True)
class Pod:
    index: int
    region: RegionSpec
    model: ModelSpec
    track: str
    ordinal: int          # within its (region, model, track) group
    group_pods: int

    @property
    def name(self) -> str:
        return f"{self.model.name}-{self.track}-{self.ordinal}.{self.region.name}"

    @property
    def version(self) -> str:
        return self.model.canary_version if self.track == "canary" else self.model.stable_version


def build_pods(spec: FleetSpec) -> list[Pod]:
    pods: list[Pod] = []
    for region in spec.regions:
        for model in spec.models:
            for track in TRACK_NAMES:
                n, base = spec.pods(model, region, track), len(pods)
                pods.extend(Pod(base + i, region, model, track, i, n) for i in range(n))
    return pods


# the judged requests' evaluation results (FleetSpec.judge_rate): a healthy model's
RELEVANCE_MEAN, RELEVANCE_SD = 0.80, 0.15  # relevance score
REFUSAL_RATE, PII_RATE = 0.02, 0.005       # guardrail flag rates


@dataclass
class Tick:
    """The requests of one tick, one array entry per request, sorted by end time. Times in integer ns
    (what the SDK's clocks give), so seconds derived from them match the SDK's to the last bit."""

    pod: np.ndarray          # index into the pod list
    end_ns: np.ndarray
    queue_ns: np.ndarray
    prefill_ns: np.ndarray   # until the first token (or the failure)
    decode_ns: np.ndarray    # first to last token (0 with one token; unused with none)
    tail_ns: np.ndarray      # last token to the response's end
    tokens_in: np.ndarray
    tokens_cached: np.ndarray
    tokens_out: np.ndarray   # 0: failed before the first token
    gap_ns: np.ndarray       # (n, 4): effective p50, p90, p99, max gap
    error: np.ndarray        # index into ERROR_TYPES + ("timeout", POD_DOWN_ERROR); -1 none
    sampled: np.ndarray      # bool: whole trace (stage spans) rather than a record-only root
    trace_ids: bytes         # 16 bytes per request
    span_ids: bytes          # 8 bytes per request (the root span; stage spans derive theirs)
    judged: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # evaluated beside serving
    relevance: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the judged ones' scores, in 0..1
    refused: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # guardrail.refusal flags
    pii: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # guardrail.pii flags

    def __len__(self) -> int:
        return len(self.end_ns)

    @property
    def start_ns(self) -> np.ndarray:
        return self.end_ns - self.e2e_ns

    @property
    def e2e_ns(self) -> np.ndarray:
        return self.queue_ns + self.prefill_ns + np.where(self.tokens_out > 0, self.decode_ns, 0) + self.tail_ns


ALL_ERRORS = (*ERROR_TYPES, "timeout", POD_DOWN_ERROR)
_TIMEOUT = len(ERROR_TYPES)
_POD_DOWN = _TIMEOUT + 1


@dataclass
class PodState:
    """Per pod, this tick: offered load and what perturbations do to it."""

    rate_rps: np.ndarray
    rho: np.ndarray
    slow: np.ndarray
    extra_errors: np.ndarray
    down: np.ndarray
    prefill_slow: np.ndarray  # prefill time only (slow_prefill): a pure TTFT shift, queueing unchanged
    quality_drop: np.ndarray  # relevance mean down and refusal rate up by this (quality_drop)
    pii_extra: np.ndarray     # PII flag rate up by this (guardrail_surge)
    prompt_scale: np.ndarray  # prompt lengths x this (prompt_shift)


def ranks(n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nearest-rank p50/p90/p99 indexes among ``n`` sorted gaps (``instrumentation.summary._ranks``)."""
    n = n.astype(np.float64)
    return tuple(np.maximum(0, np.ceil(q * n) - 1).astype(np.int64) for q in (0.5, 0.9, 0.99))  # type: ignore


def step_gaps(n_gaps: np.ndarray, p50: np.ndarray, p90: np.ndarray, p99: np.ndarray, top: np.ndarray):
    """Effective (p50, p90, p99, max) of the sorted step list ``[p50]*(i50+1) + [p90]*(i90-i50) +
    [p99]*(i99-i90) + [max]*(n-1-i99)`` and its exact sum (a tied rank takes the lower step)."""
    i50, i90, i99 = ranks(np.maximum(n_gaps, 1))
    v90 = np.where(i90 > i50, p90, p50)
    v99 = np.where(i99 > i90, p99, v90)
    vmax = np.where(n_gaps - 1 > i99, top, v99)
    total = (i50 + 1) * p50 + (i90 - i50) * v90 + (i99 - i90) * v99 + (n_gaps - 1 - i99) * vmax
    return np.stack([p50, v90, v99, vmax], axis=1), np.where(n_gaps > 0, total, 0)


def step_gap_list(n_gaps: int, p50: int, p90: int, p99: int, top: int) -> list[int]:
    """The same step list, spelled out (for replaying a simulated request through the real SDK)."""
    out: list[int] = []
    i50, i90, i99 = (max(0, math.ceil(q * n_gaps) - 1) for q in (0.5, 0.9, 0.99))
    for j in range(n_gaps):
        out.append(p50 if j <= i50 else p90 if j <= i90 else p99 if j <= i99 else top)
    return out


class Fleet:
    """The pods of a FleetSpec and the per-tick draw."""

    def __init__(self, spec: FleetSpec, seed: int = 1) -> None:
        self.spec, self.seed = spec, seed
        self.pods = build_pods(spec)
        p = self.pods
        wsum = sum(r.weight for r in spec.regions)
        ssum = sum(m.share for m in spec.models)
        track_share = {"stable": 1.0 - spec.canary_share, "canary": spec.canary_share}
        self._base_rps = np.array([spec.rate_rps * x.region.weight / wsum * x.model.share / ssum
                                   * track_share[x.track] / x.group_pods for x in p])
        self._capacity = np.array([x.model.capacity_rps for x in p])
        self._prefill_med = np.array([x.model.prefill_median_s * x.region.latency_factor for x in p])
        self._itl_med = np.array([x.model.itl_median_s * x.region.latency_factor for x in p])
        self._out_scale = np.array([x.model.output_tokens_scale for x in p])
        self._in_med = np.array([x.model.input_tokens_median for x in p])
        self._hit = np.array([x.model.prefix_hit_ratio for x in p])

    def pod_state(self, t_s: float, scale: float = 1.0) -> PodState:
        spec = self.spec
        diurnal = np.array([spec.diurnal(t_s, x.region) for x in self.pods])
        rate = self._base_rps * diurnal * scale
        slow = np.ones(len(self.pods))
        extra = np.zeros(len(self.pods))
        down = np.zeros(len(self.pods), dtype=bool)
        prefill_slow, prompt_scale = np.ones(len(self.pods)), np.ones(len(self.pods))
        quality_drop, pii_extra = np.zeros(len(self.pods)), np.zeros(len(self.pods))
        for pert in spec.perturbations:
            if not pert.active(t_s):
                continue
            for x in self.pods:
                if not pert.hits(x.region.name, x.model.name, x.track, x.ordinal):
                    continue
                if pert.kind == "slow":
                    slow[x.index] *= pert.magnitude
                elif pert.kind == "errors":
                    extra[x.index] += pert.magnitude
                elif pert.kind == "pod_down":
                    down[x.index] = True
                elif pert.kind == "slow_prefill":
                    prefill_slow[x.index] *= pert.magnitude
                elif pert.kind == "quality_drop":
                    quality_drop[x.index] += pert.magnitude
                elif pert.kind == "guardrail_surge":
                    pii_extra[x.index] += pert.magnitude
                elif pert.kind == "prompt_shift":
                    prompt_scale[x.index] *= pert.magnitude
                elif x.track == "canary":  # canary_regression
                    slow[x.index] *= pert.magnitude
                    extra[x.index] += 0.05
        # a slow pod serves fewer requests per second: its utilisation rises with it
        rho = np.minimum(rate * slow / self._capacity, 0.97)
        return PodState(rate, rho, slow, extra, down, prefill_slow, quality_drop, pii_extra, prompt_scale)

    def tick(self, k: int, t0_ns: int, dt_s: float, scale: float = 1.0) -> Tick:
        """Requests that end in ``[t0_ns + k*dt, t0_ns + (k+1)*dt)``; ``scale`` multiplies the rate."""
        spec = self.spec
        rng = np.random.default_rng([self.seed, k])
        state = self.pod_state(k * dt_s, scale)
        counts = rng.poisson(state.rate_rps * dt_s)
        pod = np.repeat(np.arange(len(self.pods)), counts)
        n = len(pod)
        dt_ns = int(dt_s * NS)
        end_ns = np.sort(t0_ns + k * dt_ns + rng.integers(0, dt_ns, n))
        rho, slow = state.rho[pod], state.slow[pod]

        tokens_in = np.clip(rng.lognormal(np.log(self._in_med[pod] * state.prompt_scale[pod]), 0.8), 8,
                            32_000).astype(np.int64)
        hit = np.minimum(1.0, rng.random(n) * 2.0 * self._hit[pod])
        tokens_cached = (tokens_in * hit).astype(np.int64)
        tokens_out = np.minimum(4096, 1 + (self._out_scale[pod] * rng.pareto(1.6, n)).astype(np.int64))

        mu = self._capacity[pod] / slow
        waits = rng.random(n) < rho
        queue_s = np.where(waits, rng.exponential(1.0 / np.maximum(mu * (1.0 - rho), 1e-3)), 0.0) + 50e-6
        prompt = (tokens_in / self._in_med[pod]) ** 0.7 * (1.0 - 0.8 * tokens_cached / tokens_in)
        prefill_s = rng.lognormal(np.log(self._prefill_med[pod] * slow * (1 + 0.5 * rho) * prompt), 0.35)
        prefill_s *= state.prefill_slow[pod]
        p50 = rng.lognormal(np.log(self._itl_med[pod] * slow * (1 + 0.6 * rho)), 0.15)
        p90 = p50 * (1 + rng.lognormal(np.log(0.25), 0.3, n))
        p99 = p90 * (1 + rng.lognormal(np.log(0.5), 0.4, n))
        top = p99 * (1 + rng.lognormal(np.log(0.3), 0.5, n))

        error = np.full(n, -1, dtype=np.int64)
        p_err = spec.error_rate + state.extra_errors[pod]
        failed = rng.random(n) < p_err
        error[failed] = rng.integers(0, len(ERROR_TYPES), int(failed.sum()))
        timed_out = (rng.random(n) < spec.timeout_rate * (1 + 10 * np.maximum(rho - 0.9, 0))) & ~failed
        error[timed_out] = _TIMEOUT
        # a failure cuts the output short (possibly before the first token)
        cut = error >= 0
        tokens_out = np.where(cut, (tokens_out * rng.random(n)).astype(np.int64), tokens_out)
        down = state.down[pod]
        error[down] = _POD_DOWN
        tokens_out[down] = 0
        queue_s[down] = 50e-6
        prefill_s[down] = rng.lognormal(np.log(0.004), 0.3, int(down.sum()))

        ns = NS
        gaps, decode_ns = step_gaps(np.maximum(tokens_out - 1, 0), *(np.maximum((x * ns).astype(np.int64), 1000)
                                                                  for x in (p50, p90, p99, top)))
        queue_ns = (queue_s * ns).astype(np.int64)
        prefill_ns = np.maximum((prefill_s * ns).astype(np.int64), 1000)
        tail_ns = (rng.lognormal(np.log(0.001), 0.5, n) * ns).astype(np.int64)
        # a timeout ends the response at the deadline, with whatever was generated by then
        to = error == _TIMEOUT
        if to.any():
            spent = queue_ns[to] + prefill_ns[to] + np.where(tokens_out[to] > 0, decode_ns[to], 0)
            tail_ns[to] = np.maximum(int(TIMEOUT_S * ns) - spent, tail_ns[to])
        sampled = rng.random(n) < spec.sample_ratio
        tick = Tick(pod=pod, end_ns=end_ns, queue_ns=queue_ns, prefill_ns=prefill_ns, decode_ns=decode_ns,
                    tail_ns=tail_ns, tokens_in=tokens_in, tokens_cached=np.minimum(tokens_cached, tokens_in),
                    tokens_out=tokens_out, gap_ns=gaps, error=error, sampled=sampled,
                    trace_ids=rng.bytes(16 * n), span_ids=rng.bytes(8 * n))
        if spec.judge_rate > 0:
            self._judge(tick, state, np.random.default_rng([self.seed, k, 1]))  # its own stream: latencies unchanged
        return tick

    def _judge(self, tick: Tick, state: PodState, rng: np.random.Generator) -> None:
        """The judged share's evaluation results: relevance ~ Beta (mean RELEVANCE_MEAN, s.d. RELEVANCE_SD), refusal
        and PII flags ~ Bernoulli; a failed request is not judged (no answer)."""
        n, pod = len(tick), tick.pod
        tick.judged = (rng.random(n) < self.spec.judge_rate) & (tick.error < 0) & (tick.tokens_out > 0)
        mean = np.clip(RELEVANCE_MEAN - state.quality_drop[pod], 0.05, 0.95)
        total = mean * (1 - mean) / RELEVANCE_SD ** 2 - 1  # Beta(a, b) with this mean and s.d.
        tick.relevance = rng.beta(mean * total, (1 - mean) * total)
        tick.refused = rng.random(n) < REFUSAL_RATE + state.quality_drop[pod]
        tick.pii = rng.random(n) < PII_RATE + state.pii_extra[pod]


def pod_gauges(fleet: Fleet, state: PodState, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each pod's gauges from its load (Little's law for queue and running requests), by metric name.
    GPU gauges are per GPU of the pod (the same value on each, as a tensor-parallel pod shows)."""
    from infersight.schemas import metrics as M

    cap, rho, rate = fleet._capacity, state.rho, state.rate_rps
    mu = cap / state.slow
    wait_s = rho / np.maximum(mu * (1 - rho), 1e-3)
    queue = np.round(rate * wait_s * rng.uniform(0.7, 1.3, len(rho)))
    e2e_s = fleet._prefill_med + fleet._itl_med * (1 + fleet._out_scale / 0.6)
    running = np.minimum(256, np.round(rate * e2e_s * rng.uniform(0.8, 1.2, len(rho))))
    kv = np.minimum(1.0, running * (fleet._in_med + fleet._out_scale / 0.6) / 400_000.0)
    util = np.clip(0.08 + 0.9 * rho + rng.normal(0, 0.03, len(rho)), 0.0, 1.0)
    gpus = np.array([p.model.gpus_per_pod for p in fleet.pods])
    limit = np.full(len(rho), 80e9)
    weights = np.array([{1: 16e9, 2: 24e9, 4: 36e9}.get(int(g), 20e9) for g in gpus])
    used = np.minimum(limit, weights + 0.9 * (limit - weights) * np.maximum(kv, 0.05))
    for arr in (queue, running, util):
        arr[state.down] = 0.0
    return {M.QUEUE_DEPTH: queue, M.REQUESTS_RUNNING: running, M.KV_CACHE_USAGE: kv, M.BATCH_SIZE: running,
            M.HW_GPU_UTILIZATION: util, M.HW_GPU_MEMORY_USAGE: used, M.HW_GPU_MEMORY_LIMIT: limit}
