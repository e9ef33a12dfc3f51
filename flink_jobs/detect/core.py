"""Streaming anomaly detection, pure Python: per-signal detectors and the cross-region incident correlator.

No Flink here: the job wires these classes into keyed state; ``replay.py`` runs them over a CSV. Every
class keeps only plain fields (numbers, strings, lists, dicts) and has ``to_state()`` / ``from_state()``, so a
job can checkpoint it and a restart continues with exactly the same output. Given the same rows in the same
order, the output is the same (no clocks, no randomness, sets are always sorted before they are emitted).

``Detector`` — one (series, signal): Holt level + trend with a robust (Huber-clipped, floored) spread, an
hour-of-day seasonal term once a day of history exists, a signed z-score in the signal's bad direction (never
saturated), explicit warm-up, and an episode state machine (the novelty step): one onset per anomaly, the
baseline frozen while the anomaly lasts, the end after a few clean windows, re-baselining when a change
persists for ``max_episode`` windows (it is the new normal).

``Likelihood`` — an optional second stage over a detector's z: a score in [0, 1] of how unusual the recent |z| is
for this series, with a rest period after a high one (what ``bench/nab.py`` scores on NAB).

``Engine`` — the fleet: one detector per (region, model, track, signal), silent series (a series that stops
sending raises a ``silent`` anomaly, unless its region's status explains it: ``regions.py``), new tracks (for
likely causes), bad input counted, idle series expired.

``Correlator`` — anomalies into incidents: scope, kind, k-of-N regions against chance, failover absorption,
likely cause, open / update / resolve.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from infersight.flink_jobs.detect.regions import RegionStatuses
from infersight.schemas.detection import SIGNAL_BY_NAME, SILENT, Signal

DAY_S = 86_400.0


@dataclass(frozen=True)
class DetectorParams:
    warmup: int = 30  # windows of history before any alert
    alpha: float = 0.08  # level smoothing
    beta: float = 0.004  # trend smoothing
    spread_alpha: float = 0.02  # smoothing of the mean absolute residual
    huber: float = 3.0  # residuals clipped at this many spreads when they update the baseline
    spread_clip: float = 2.0  # only residuals within this many spreads update the spread
    spread_factor: float = 1.39  # sigma / mean |residual| of a normal truncated at spread_clip sigmas
    threshold: float = 7.0  # z that opens an episode in one window
    confirm_threshold: float = 4.5  # z that opens it when two windows in a row reach it
    clear: float = 3.0  # |z| under which a window of an episode counts as clean
    clear_windows: int = 3  # clean windows that end an episode
    max_episode: int = 360  # windows after which a persisting change becomes the new baseline
    shadow_alpha: float = 0.1  # smoothing of the level followed during an episode (for re-baselining)
    season_bins: int = 24  # hour-of-day seasonal term
    season_period_s: float = DAY_S  # the seasonal period (a day; a week for weekly patterns)
    season_alpha: float = 0.02
    season_after_s: float = DAY_S  # the seasonal term is used once this much history exists
    gap_reset_s: float = 6 * 3600.0  # a gap (or a clock jump) larger than this restarts the warm-up
    floor_abs: float = 1e-9  # spread floors; per signal from schemas.detection
    floor_rel: float = 0.0
    direction: str = "both"  # "up" | "down" | "both"

    @classmethod
    def for_signal(cls, signal: Signal | str, **overrides: Any) -> DetectorParams:
        s = SIGNAL_BY_NAME[signal] if isinstance(signal, str) else signal
        role = ROLE_PARAMS.get(s.role, {})
        return cls(**{"floor_abs": s.floor_abs, "floor_rel": s.floor_rel, "direction": s.direction, **role,
                      **overrides})


# latencies barely follow the daily load: a slower level catches a creep of tens of minutes
ROLE_PARAMS: dict[str, dict[str, Any]] = {"latency": {"alpha": 0.03, "beta": 0.0}}


@dataclass
class Detector:
    """One series and signal. ``update(t, x)`` returns ``(z, event)``: z the signed score in the signal's bad
    direction (0 during warm-up), event ``None`` | ``"onset"`` | ``"end"``."""

    n: int = 0
    level: float = 0.0
    trend: float = 0.0
    mad: float = 0.0
    last_t: float | None = None
    first_t: float | None = None
    step: float = 0.0
    season: list[float] = field(default_factory=list)
    active: bool = False
    reported: bool = False  # the episode is in the bad direction (an onset was emitted)
    episode_len: int = 0
    clean: int = 0
    clean_sum: float = 0.0
    pending: bool = False  # the previous window reached confirm_threshold
    shadow: float = 0.0
    shadow_mad: float = 0.0
    peak: float = 0.0
    expected: float = 0.0
    sign: int = 0  # +1 / -1: the way the last onset went
    n_nan: int = 0
    n_inf: int = 0
    n_out_of_order: int = 0
    n_clock_jumps: int = 0
    n_rebaselined: int = 0

    def spread(self, p: DetectorParams) -> float:
        return max(p.spread_factor * self.mad, p.floor_abs, p.floor_rel * abs(self.level))

    def _restart(self, t: float, x: float) -> None:
        self.n, self.level, self.trend, self.mad = 1, x, 0.0, 0.0
        self.first_t, self.last_t = t, t
        self.active, self.episode_len, self.clean, self.pending = False, 0, 0, False
        self.season = []

    def update(self, t: float, x: float, p: DetectorParams) -> tuple[float, str | None]:
        if x != x:
            self.n_nan += 1
            return 0.0, None
        if x in (math.inf, -math.inf):
            self.n_inf += 1
            return 0.0, None
        if self.last_t is None:
            self._restart(t, x)
            self.expected = x
            return 0.0, None
        dt = t - self.last_t
        if dt <= 0:
            if dt < -p.gap_reset_s:  # the clock jumped back: start again rather than skip forever
                self.n_clock_jumps += 1
                event = "end" if self.active else None
                self._restart(t, x)
                return 0.0, event
            self.n_out_of_order += 1
            return 0.0, None
        if dt > p.gap_reset_s:
            self.n_clock_jumps += 1
            event = "end" if self.active else None
            self._restart(t, x)
            return 0.0, event
        self.step = dt if self.step <= 0 or dt < self.step else self.step
        k = max(1.0, round(dt / self.step))
        self.last_t = t
        base = self.level + self.trend * k
        seasoned = (t - self.first_t) >= p.season_after_s and len(self.season) == p.season_bins
        b = int((t % p.season_period_s) * p.season_bins / p.season_period_s) % p.season_bins
        pred = base + (self.season[b] if seasoned else 0.0)
        self.expected = pred
        r = x - pred
        self.n += 1
        if self.n <= p.warmup:  # warm-up: learn freely, never alert
            new_level = pred + (max(p.alpha, 1.0 / self.n)) * r
            self.trend += p.beta * ((new_level - self.level) / k - self.trend) if self.n > 2 else 0.0
            self.level = new_level
            self.mad += max(p.spread_alpha, 1.0 / self.n) * (abs(r) - self.mad)
            return 0.0, None
        s = self.spread(p)
        z = r / s
        zd = z if p.direction == "up" else -z if p.direction == "down" else abs(z)
        if self.active:
            self.episode_len += 1
            self.shadow_mad += p.shadow_alpha * (abs(x - self.shadow) - self.shadow_mad)
            self.shadow += p.shadow_alpha * (x - self.shadow)
            self.peak = max(self.peak, zd)
            if (zd if self.reported and p.direction != "both" else abs(z)) < p.clear:
                self.clean += 1
                self.clean_sum += x
            else:
                self.clean, self.clean_sum = 0, 0.0
            if not self.reported and zd >= p.threshold:  # a good-news change turned bad: report it now
                self.reported, self.sign = True, (1 if z > 0 else -1)
                return zd, "onset"
            if self.clean >= p.clear_windows and self.reported and \
                    abs(self.clean_sum / self.clean - self.level) >= p.clear * s:
                # the bad news is over but the series sits far on the good side: the anomaly ends, the
                # baseline stays frozen (unreported) until it is back or the change proves permanent
                self.reported, self.clean, self.clean_sum = False, 0, 0.0
                return zd, "end"
            if self.clean >= p.clear_windows or self.episode_len >= p.max_episode:
                if self.clean < p.clear_windows:  # the change persisted: it is the new normal
                    self.n_rebaselined += 1
                    self.level, self.trend = self.shadow, 0.0
                    self.mad = max(self.mad, self.shadow_mad)
                else:
                    self.level = self.clean_sum / self.clean
                self.active = False
                return zd, ("end" if self.reported else None)
            return zd, None
        za = abs(z)
        onset = za >= p.threshold or (za >= p.confirm_threshold and self.pending)
        self.pending = za >= p.confirm_threshold
        if onset:  # an episode either way freezes the baseline; only the bad direction is reported
            self.active, self.episode_len, self.clean, self.clean_sum, self.pending = True, 0, 0, 0.0, False
            self.shadow, self.shadow_mad, self.peak, self.sign = x, self.mad, zd, (1 if z > 0 else -1)
            self.reported = zd >= p.confirm_threshold
            return zd, ("onset" if self.reported else None)
        c = p.huber * s
        rc = -c if r < -c else c if r > c else r
        new_level = base + p.alpha * rc
        self.trend += p.beta * ((new_level - self.level) / k - self.trend)
        self.level = new_level
        if abs(r) < p.spread_clip * s:  # outliers do not widen the spread (a creep would hide itself so)
            self.mad += p.spread_alpha * (abs(r) - self.mad)
        if not self.season:
            self.season = [0.0] * p.season_bins
        if len(self.season) == p.season_bins:  # towards this hour's mean of value - (level + trend)
            self.season[b] += p.season_alpha * (rc if seasoned else rc - self.season[b])
        return zd, None

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Detector:
        names = {f.name for f in fields(cls)}
        d = cls(**{k: v for k, v in state.items() if k in names})
        d.season = list(d.season)
        return d


@dataclass(frozen=True)
class LikelihoodParams:
    short_alpha: float = 0.3  # smoothing of the recent |z| (a few points)
    long_alpha: float = 0.003  # smoothing of the long-run mean and variance of |z| (a few hundred points)
    min_points: int = 50  # points of |z| history before a likelihood is given
    gate: float = 0.999  # a likelihood this high starts the rest period
    rest: int = 100  # points after such a likelihood that score 0 (suppression after detection)
    z_cap: float = 50.0


@dataclass
class Likelihood:
    """Anomaly likelihood over a detector's |z| (the idea of Numenta's anomaly likelihood): how unusual the recent
    |z| is against this series' own long-run distribution of |z|, in [0, 1], with a rest period after a high
    one so one anomaly scores high once. A series whose errors are always large stops looking anomalous."""

    n: int = 0
    short: float = 0.0
    mean: float = 0.0
    var: float = 1.0
    quiet: int = 0

    def score(self, z: float, p: LikelihoodParams) -> float:
        """The likelihood of this |z|, without the rest period (``update`` adds it; the NAB scorer adds its own
        over a combined score). Any ``p`` with ``z_cap``, ``short_alpha``, ``long_alpha`` and ``min_points``."""
        raw = min(abs(z), p.z_cap)
        self.n += 1
        self.short += p.short_alpha * (raw - self.short)
        if self.n > p.min_points:
            lik = 0.5 * (1.0 + math.erf((self.short - self.mean) / math.sqrt(2.0 * max(self.var, 1e-6))))
        else:
            lik = 0.5
        d = raw - self.mean
        self.mean += p.long_alpha * d
        self.var = (1 - p.long_alpha) * (self.var + p.long_alpha * d * d)
        return lik

    def update(self, z: float, p: LikelihoodParams) -> float:
        lik = self.score(z, p)
        self.quiet -= 1
        if self.quiet > 0:
            return 0.0
        if lik >= p.gate:
            self.quiet = p.rest
        return lik

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Likelihood:
        return cls(**state)


# ---------------------------------------------------------------------------------------------- incidents

OUTAGE_SIGNALS = ("request_rate", "tokens_per_s")  # a fall of these is a failing region
LOAD_SIGNALS = {"request_rate", "tokens_per_s", "queue_depth", "ttft_p50", "ttft_p99", "itl_p99", "e2e_p99",
                "kv_cache_usage", "batch_size", "gpu_utilization"}  # a rise of these is absorbed load


@dataclass(frozen=True)
class CorrelatorParams:
    resolve_windows: int = 30  # clean windows (no member anomaly active) that resolve an incident
    lag_windows: int = 12  # another region's onset this close to the incident's start can join it
    join_windows: int = 60  # an onset this close to the last one of the same model and region joins it
    chance_p: float = 0.05  # a region joins only if its coincidence is less likely than this by chance
    rate_alpha: float = 1.0 / 8640  # per-window smoothing of each region's own onset rate (about a day)
    rate_prior: float = 1.0 / 8640  # a region's onset rate before it has a history
    cause_windows: int = 60  # a new track this long before the onset is named as the likely cause
    max_anomalies: int = 200  # anomalies kept per incident (the counts go on)
    region_ttl_s: float = DAY_S  # a region not seen this long no longer counts in N


def _binom_tail(n: int, k: int, q: float) -> float:
    return sum(math.comb(n, j) * q ** j * (1 - q) ** (n - j) for j in range(k, n + 1))


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@dataclass
class Correlator:
    incidents: list[dict[str, Any]] = field(default_factory=list)  # open incidents
    rates: dict[str, float] = field(default_factory=dict)  # region -> onsets per window
    topology: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)  # region->model->track->t
    new_tracks: list[list[Any]] = field(default_factory=list)  # [t, region, model, track], most recent 50
    next_id: int = 1
    step: float = 10.0
    region_causes: dict[str, str] = field(default_factory=dict)  # region -> its status' likely cause (regions.py)

    # ---- topology
    def see(self, t: float, region: str, model: str, track: str) -> bool:
        """Record that a series sent in window t; True when it is a new track of a model already served."""
        models = self.topology.setdefault(region, {})
        tracks = models.setdefault(model, {})
        new = track not in tracks and bool(tracks)
        tracks[track] = max(t, tracks.get(track, t))  # a late window does not make the track older
        if new:
            self.new_tracks.append([t, region, model, track])
            del self.new_tracks[:-50]
        return new

    def expire(self, now: float, ttl: float) -> None:
        for region in list(self.topology):
            models = self.topology[region]
            for model in list(models):
                tracks = models[model]
                for track in [tr for tr, seen in tracks.items() if now - seen > ttl]:
                    del tracks[track]
                if not tracks:
                    del models[model]
            if not models:
                del self.topology[region]

    def known_regions(self, now: float, p: CorrelatorParams) -> list[str]:
        return sorted(r for r, models in self.topology.items()
                      if any(now - seen <= p.region_ttl_s for tracks in models.values() for seen in tracks.values()))

    # ---- the window
    def tick(self, t: float, onsets: list[dict[str, Any]], active: set[tuple[str, str, str, str]],
             p: CorrelatorParams) -> list[dict[str, Any]]:
        """Feed one closed window: its anomaly onsets and the keys (region, model, track, signal) of every
        detector in an episode. Returns the incident events (open / update / resolve) it caused."""
        events: list[dict[str, Any]] = []
        alerted: set[str] = set()  # regions that opened an incident or joined one as a new region
        changed: list[dict[str, Any]] = []
        fresh: list[dict[str, Any]] = []
        for a in sorted(onsets, key=lambda a: (a["region"], a["model"], a["track"], a["signal"])):
            inc = self._home(a, t, p)
            if inc is None:
                inc = self._new(a, t)
                fresh.append(inc)
                alerted.add(a["region"])
            else:
                if a["region"] not in inc["by_region"]:
                    alerted.add(a["region"])
                self._add(inc, a)
            if inc not in changed:
                changed.append(inc)
        for inc in self.incidents:  # a region's status gave a cause since: say it (an update if it changes)
            if inc not in changed and set(inc.get("regions", ())) & set(self.region_causes):
                changed.append(inc)
        for region in self.known_regions(t, p):
            r = self.rates.get(region, p.rate_prior)
            self.rates[region] = r + p.rate_alpha * ((1.0 if region in alerted else 0.0) - r)
        for inc in self.incidents:
            keys = {tuple(k) for k in inc["keys"]}
            if keys & active or any(inc is c for c in changed):
                inc["last_active"] = t
                inc["clean"] = 0
            else:
                inc["clean"] += 1
        for inc in changed:
            self._describe(inc, t, p)
            sig = (inc["scope_kind"], inc["kind"], tuple(inc["regions"]), tuple(inc["absorbing_regions"]),
                   tuple(inc["models"]), tuple(inc["signals"]), inc["severity"], inc["likely_cause"])
            if any(inc is f for f in fresh):
                inc["sig"] = list(sig)
                events.append(self.event(inc, "open"))
            elif list(sig) != inc.get("sig"):
                inc["sig"] = list(sig)
                events.append(self.event(inc, "update"))
        still = []
        for inc in self.incidents:
            if inc["clean"] >= p.resolve_windows:
                inc["end"] = inc["last_active"]
                events.append(self.event(inc, "resolve"))
            else:
                still.append(inc)
        self.incidents = still
        return events

    def _home(self, a: dict[str, Any], t: float, p: CorrelatorParams) -> dict[str, Any] | None:
        """The open incident this anomaly belongs to: one holding the same detector; one with an onset of the
        same model in the same region less than ``join_windows`` ago; else one that started within the lag, in
        the same region or in others that make this coincidence unlikely by chance."""
        key = [a["region"], a["model"], a["track"], a["signal"]]
        for inc in self.incidents:
            if key in inc["keys"]:
                return inc
        rm = f"{a['region']}|{a['model']}"
        for inc in self.incidents:
            last = inc["rm_last"].get(rm)
            if last is not None and t - last <= p.join_windows * self.step:
                return inc
        for inc in self.incidents:
            if t - inc["start"] > p.lag_windows * self.step:
                continue
            if a["region"] in inc["by_region"]:
                return inc
            n_other = max(1, len(self.known_regions(t, p)) - 1)
            joined = [r for r in inc["by_region"] if r != a["region"]] + [a["region"]]
            k = len(joined) - 1  # regions beyond the first
            lag = int(round((t - inc["start"]) / self.step))  # the coincidence as close as it was observed
            q = max(1 - (1 - self.rates.get(r, p.rate_prior)) ** (2 * lag + 1) for r in joined)
            chance = _binom_tail(n_other, k, q)
            if chance < p.chance_p:
                inc["chance_p"] = chance
                return inc
        return None

    def _new(self, a: dict[str, Any], t: float) -> dict[str, Any]:
        inc = {"id": f"inc-{self.next_id}", "start": t, "end": None, "last_active": t, "clean": 0,
               "by_region": {}, "keys": [], "rm_last": {}, "anomalies": [], "n_anomalies": 0, "max_score": 0.0,
               "chance_p": None, "sig": None}
        self.next_id += 1
        self.incidents.append(inc)
        self._add(inc, a)
        return inc

    def _add(self, inc: dict[str, Any], a: dict[str, Any]) -> None:
        key = [a["region"], a["model"], a["track"], a["signal"]]
        if key not in inc["keys"]:
            inc["keys"].append(key)
        inc["by_region"].setdefault(a["region"], [])
        entry = [a["model"], a["track"], a["signal"], a["direction"]]
        if entry not in inc["by_region"][a["region"]]:
            inc["by_region"][a["region"]].append(entry)
        inc["n_anomalies"] += 1
        inc["rm_last"][f"{a['region']}|{a['model']}"] = a["window_end"]
        inc["max_score"] = max(inc["max_score"], float(a["score"]) if math.isfinite(a["score"]) else 1e9)
        if len(inc["anomalies"]) < 200:
            inc["anomalies"].append({k: a[k] for k in ("window_end", "region", "model", "track", "signal",
                                                        "direction", "score")})

    def _describe(self, inc: dict[str, Any], t: float, p: CorrelatorParams) -> None:
        by = inc["by_region"]

        def failing(entries: list[list[str]]) -> bool:
            return any((s in OUTAGE_SIGNALS and d == "down") or s == SILENT for _, _, s, d in entries)

        def load_only(entries: list[list[str]]) -> bool:
            return all(s in LOAD_SIGNALS and d == "up" for _, _, s, d in entries)

        failing_regions = sorted(r for r, e in by.items() if failing(e))
        absorbing: list[str] = []
        if len(failing_regions) == 1:
            absorbing = sorted(r for r, e in by.items() if r not in failing_regions and load_only(e))
        affected = sorted(r for r in by if r not in absorbing)
        n_known = len(self.known_regions(t, p))
        entries = [e for r in affected for e in by[r]]
        signals = sorted({e[2] for e in entries})
        models = sorted({e[0] for e in entries})
        if len(affected) >= 2 and len(affected) >= n_known:
            scope = "global"
        elif len(affected) >= 2:
            scope = "multi_region"
        else:
            region = affected[0]
            served = self.topology.get(region, {})
            if len(models) >= 2 or (failing(entries) and len(served) <= 1) or absorbing:
                scope = "region"
            else:
                tracks = {e[1] for e in entries}
                live = [tr for tr, seen in served.get(models[0], {}).items() if t - seen <= 3 * self.step]
                scope = "series" if len(live) > 1 and len(tracks) == 1 else "model_region"
        dirs = {(e[2], e[3]) for e in entries}
        cause = None
        down = [r for r in affected if r in self.region_causes]
        if down:  # the region status service saw it: more direct than a new track
            cause = "; ".join(f"{self.region_causes[r]} in {r}" for r in down)
        for nt_t, nt_region, nt_model, nt_track in reversed(self.new_tracks if cause is None else []):
            if nt_region in affected and inc["start"] - p.cause_windows * self.step <= nt_t <= inc["start"] + \
                    p.lag_windows * self.step:
                where = sorted({r for tt, r, m, tr in self.new_tracks if m == nt_model and tr == nt_track
                                and r in affected})
                cause = f"{nt_model} track {nt_track} appeared in {_join(where)}"
                break
        if any(s == SILENT for s, _ in dirs) and not any(s in OUTAGE_SIGNALS and d == "down" for s, d in dirs):
            kind = "outage" if down else "silent"  # a silence whose gateways are down is an outage
        elif any(s in OUTAGE_SIGNALS and d == "down" for s, d in dirs):
            kind = "outage"
        elif cause is not None and scope in ("global", "multi_region"):
            kind = "bad_rollout"
        elif ("prefix_cache_hit_ratio", "down") in dirs:
            kind = "cache_thrash"
        elif ("error_ratio", "up") in dirs:
            kind = "errors"
        elif ("request_rate", "up") in dirs:
            kind = "traffic_surge"
        elif any(s in ("ttft_p50", "ttft_p99", "itl_p99", "e2e_p99") for s, _ in dirs):
            kind = "latency"
        else:
            kind = "degradation"
        if kind in ("outage", "silent", "bad_rollout") or scope in ("global", "multi_region") or \
                inc["max_score"] >= 30:
            severity = "critical"
        elif scope == "region" or inc["max_score"] >= 12:
            severity = "major"
        else:
            severity = "minor"
        inc.update(scope_kind=scope, kind=kind, regions=affected, absorbing_regions=absorbing, models=models,
                   signals=signals, severity=severity, likely_cause=cause)
        inc["summary"] = self._summary(inc, n_known)

    @staticmethod
    def _summary(inc: dict[str, Any], n_known: int) -> str:
        regions, scope, kind = inc["regions"], inc["scope_kind"], inc["kind"]
        changes = ", ".join(sorted({f"{s} {d}" for r in regions for _, _, s, d in inc["by_region"][r]}))
        if kind == "outage":
            head = f"{_join(regions)} failing ({changes})"
        elif kind == "silent":
            head = f"{_join(regions)} silent: its series stopped sending"
        elif scope == "global":
            head = f"global {kind.replace('_', ' ')}: all {len(regions)} regions ({changes})"
        elif scope == "multi_region":
            head = f"{kind.replace('_', ' ')} in {len(regions)} of {n_known} regions, {_join(regions)} ({changes})"
        elif scope == "region":
            head = f"{kind.replace('_', ' ')} in {regions[0]} across {_join(inc['models'])} ({changes})"
        else:
            head = f"{kind.replace('_', ' ')} for {inc['models'][0]} in {regions[0]} ({changes})"
        if inc["absorbing_regions"]:
            head += f"; {_join(inc['absorbing_regions'])} absorbing its load"
        if inc["likely_cause"]:
            head += f"; likely cause: {inc['likely_cause']}"
        return head

    @staticmethod
    def event(inc: dict[str, Any], kind: str) -> dict[str, Any]:
        return {"type": "incident", "event": kind, "id": inc["id"], "kind": inc["kind"],
                "scope_kind": inc["scope_kind"], "regions": list(inc["regions"]),
                "absorbing_regions": list(inc["absorbing_regions"]), "models": list(inc["models"]),
                "signals": list(inc["signals"]), "start": inc["start"], "end": inc["end"],
                "severity": inc["severity"], "chance_p": inc["chance_p"], "likely_cause": inc["likely_cause"],
                "anomalies": inc["n_anomalies"], "summary": inc["summary"]}

    def to_state(self) -> dict[str, Any]:
        import copy

        return copy.deepcopy(asdict(self))

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Correlator:
        import copy

        return cls(**copy.deepcopy(state))


# ---------------------------------------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class EngineParams:
    silent_windows: int = 3  # windows without a row after which an established series is silent
    established_windows: int = 30  # windows a series must have sent before its silence means anything
    expire_s: float = 6 * 3600.0  # a series silent this long is forgotten (bounded state)
    silent_active_s: float = 3600.0  # a silence keeps its incident open this long at most
    max_series: int = 100_000  # detectors beyond this are refused (counted), bounding memory
    default_step: float = 10.0
    detector: dict[str, DetectorParams] = field(
        default_factory=lambda: {name: DetectorParams.for_signal(name) for name in SIGNAL_BY_NAME})
    correlator: CorrelatorParams = field(default_factory=CorrelatorParams)

    @classmethod
    def with_warmup(cls, windows: int) -> EngineParams:
        """The defaults with every detector's warm-up, and the history a silence needs, at ``windows``."""
        if windows < 1:
            raise ValueError(f"a warm-up of {windows} windows: want at least 1")
        return cls(established_windows=windows,
                   detector={name: DetectorParams.for_signal(name, warmup=windows) for name in SIGNAL_BY_NAME})


@dataclass
class Engine:
    """Feed window-stats rows in window order with ``observe``; ``flush`` at the end. Events (anomaly points
    and incident events) come back from both."""

    params: EngineParams = field(default_factory=EngineParams)
    detectors: dict[str, Detector] = field(default_factory=dict)  # "region|model|track|signal"
    series: dict[str, list[float]] = field(default_factory=dict)  # "region|model|track" -> [last_t, windows]
    silent: dict[str, float] = field(default_factory=dict)  # series -> when it fell silent
    correlator: Correlator = field(default_factory=Correlator)
    current_t: float | None = None
    step: float = 0.0
    onsets: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    regions: RegionStatuses = field(default_factory=RegionStatuses)
    heard: dict[str, float] = field(default_factory=dict)  # series -> window open when its last late row came

    def count(self, reason: str, n: int = 1) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + n

    def region_status(self, record: dict[str, Any]) -> bool:
        """Take a region's latest status (a valid ``infersight.region_status`` record); True if it is news."""
        return self.regions.apply(record, self.current_t)

    def observe(self, t: float, region: str, model: str, track: str, signal: str, value: float
                ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self.current_t is None:
            self.current_t = t
        elif t > self.current_t:
            events = self.close_window()
            dt = t - self.current_t
            self.step = dt if self.step <= 0 or dt < self.step else self.step
            self.current_t = t
        elif t < self.current_t:  # a delayed region's windows catching up: fed in order, and they count as news
            self.count("late_row")
            self.heard[f"{region}|{model}|{track}"] = self.current_t
        if value != value:
            self.count("nan_value")
            return events
        if value in (math.inf, -math.inf):
            self.count("inf_value")
            return events
        skey = f"{region}|{model}|{track}"
        s = self.series.get(skey)
        if s is None:
            if len(self.series) >= self.params.max_series:
                self.count("series_limit")
                return events
            s = self.series[skey] = [t, 0.0]
            self.correlator.see(t, region, model, track)
        if t > s[0] or s[1] == 0:
            s[1] += 1
            if t > s[0]:
                s[0] = t
            self.correlator.see(t, region, model, track)
        if skey in self.silent:  # it is back
            del self.silent[skey]
        self.regions.resume(skey)
        dkey = f"{skey}|{signal}"
        d = self.detectors.get(dkey)
        if d is None:
            d = self.detectors[dkey] = Detector()
        p = self.params.detector[signal]
        z, ev = d.update(t, value, p)
        if ev == "onset" and signal in OUTAGE_SIGNALS and d.sign < 0 and self.regions.explains(region):
            # a delayed region's partial window, or its traffic ending: the episode goes on unreported (no score
            # shown); it is reported if the fall persists once the status no longer explains it
            d.reported = False
            self.count("traffic_fall_explained")
        elif ev == "onset":
            direction = "up" if d.sign > 0 else "down"
            self.onsets.append({
                "type": "anomaly", "window_end": t, "region": region, "model": model, "track": track,
                "signal": signal, "direction": direction, "value": value, "expected": d.expected, "score": z,
                "summary": f"{signal} {direction} for {model} ({track}) in {region}: {value:.4g} "
                           f"against {d.expected:.4g} expected (score {z:.1f})"})
        return events

    def close_window(self) -> list[dict[str, Any]]:
        t = self.current_t
        if t is None:
            return []
        step = self.step or self.params.default_step
        self.correlator.step = step
        ep = self.params
        onsets, self.onsets = self.onsets, []
        for skey, (last, n) in list(self.series.items()):
            if t - last > ep.expire_s:
                del self.series[skey]
                for sig in SIGNAL_BY_NAME:
                    self.detectors.pop(f"{skey}|{sig}", None)
                self.silent.pop(skey, None)
                self.heard.pop(skey, None)
                self.regions.forget(skey)
                self.count("series_expired")
                continue
            heard = self.heard.get(skey, last)
            if heard <= last:  # current again: forget the burst
                self.heard.pop(skey, None)
            quiet = t - max(last, heard)
            if n >= ep.established_windows and quiet >= ep.silent_windows * step and skey not in self.silent \
                    and skey not in self.regions.held:
                region, model, track = skey.split("|", 2)
                siblings = self.correlator.topology.get(region, {}).get(model, {})
                if any(tr != track and t - seen < ep.silent_windows * step for tr, seen in siblings.items()):
                    self.silent[skey] = -1e18  # a retired track (its model still serves): not an anomaly
                    self.count("track_retired")
                    continue
                if self.regions.explains(region):
                    self.regions.hold(skey, model, t)
                    self.count("silence_explained")
                    continue
                self.silent[skey] = t
                onsets.append(self._silent_onset(skey, t))
        onsets += self._review_silences(t, step)
        notices = self.regions.notice_events(t)
        active = {tuple(k.split("|", 3)) for k, d in self.detectors.items() if d.active and d.reported}
        active |= {(*k.split("|", 2), SILENT) for k, since in self.silent.items()
                   if t - since < ep.silent_active_s}
        self.correlator.expire(t, ep.expire_s)
        self.correlator.region_causes = self.regions.causes()
        events = self.correlator.tick(t, onsets, active, ep.correlator)  # type: ignore[arg-type]
        return onsets + events + notices

    def _silent_onset(self, skey: str, t: float) -> dict[str, Any]:
        region, model, track = skey.split("|", 2)
        last = self.series[skey][0]
        return {"type": "anomaly", "window_end": t, "region": region, "model": model, "track": track,
                "signal": SILENT, "direction": "down", "value": 0.0, "expected": 1.0,
                "score": float(self.params.silent_windows),
                "summary": f"{model} ({track}) in {region} silent for {t - last:.0f} s"}

    def _review_silences(self, t: float, step: float) -> list[dict[str, Any]]:
        """A region's status changed while its series were quiet: silences it now explains are held (their
        incidents resolve as usual), held series it no longer explains are silent after all."""
        for skey, since in sorted(self.silent.items()):
            if since > -1e17 and self.regions.explains(skey.split("|", 1)[0]):
                del self.silent[skey]
                self.regions.hold(skey, skey.split("|", 2)[1], t)
                self.count("silence_explained")
        onsets = []
        for skey in self.regions.to_release(t, self.params.silent_windows * step):
            if skey in self.series:
                self.silent[skey] = t
                onsets.append(self._silent_onset(skey, t))
        return onsets

    def flush(self) -> list[dict[str, Any]]:
        """Close the last window and resolve what is still open (end of a replay)."""
        events = self.close_window()
        self.current_t = None
        for inc in self.correlator.incidents:
            inc["end"] = inc["last_active"]
            events.append(self.correlator.event(inc, "resolve"))
        self.correlator.incidents = []
        return events

    def to_state(self) -> dict[str, Any]:
        return {"detectors": {k: d.to_state() for k, d in self.detectors.items()},
                "series": {k: list(v) for k, v in self.series.items()}, "silent": dict(self.silent),
                "correlator": self.correlator.to_state(), "current_t": self.current_t, "step": self.step,
                "onsets": [dict(o) for o in self.onsets], "counts": dict(self.counts),
                "regions": self.regions.to_state(), "heard": dict(self.heard)}

    @classmethod
    def from_state(cls, state: dict[str, Any], params: EngineParams | None = None) -> Engine:
        return cls(params=params or EngineParams(),
                   detectors={k: Detector.from_state(v) for k, v in state["detectors"].items()},
                   series={k: list(v) for k, v in state["series"].items()}, silent=dict(state["silent"]),
                   correlator=Correlator.from_state(state["correlator"]), current_t=state["current_t"],
                   step=state["step"], onsets=[dict(o) for o in state["onsets"]], counts=dict(state["counts"]),
                   regions=RegionStatuses.from_state(state.get("regions")), heard=dict(state.get("heard", {})))
