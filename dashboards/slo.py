"""The SLO config (``slo.yaml``): per-model TTFT and availability objectives, checked against the histogram.

Read by the rule generator (recording rules and burn-rate alerts) and the on-call dashboard (SLO lines).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from infersight.schemas import metrics as M

CONFIG = Path(__file__).with_name("slo.yaml")
KEYS = ("ttft_threshold_s", "ttft_objective", "availability_objective", "period_days")


@dataclass(frozen=True)
class Objective:
    ttft_threshold_s: float
    ttft_objective: float
    availability_objective: float
    period_days: int


@dataclass(frozen=True)
class SLOConfig:
    default: Objective
    models: dict[str, Objective]

    def groups(self) -> list[tuple[str, Objective]]:
        """(PromQL model matcher, objective): each listed model alone, then every other model."""
        out = [(f'model="{m}"', o) for m, o in sorted(self.models.items())]
        others = "|".join(sorted(self.models))
        out.append((f'model!~"{others}"' if others else 'model=~".+"', self.default))
        return out


def le(bound: float) -> str:
    """A bound as the remote-write ``le`` label spells it (Go's shortest float: 0.25, 1, 10)."""
    return f"{bound:.15g}"


def _objective(raw: dict, base: dict, where: str) -> Objective:
    unknown = set(raw) - set(KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(KEYS)}")
    merged = {**base, **raw}
    missing = [k for k in KEYS if k not in merged]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    o = Objective(float(merged["ttft_threshold_s"]), float(merged["ttft_objective"]),
                  float(merged["availability_objective"]), int(merged["period_days"]))
    if o.ttft_threshold_s not in M.TTFT_BUCKETS:
        raise ValueError(f"{where}: ttft_threshold_s {o.ttft_threshold_s} is not a TTFT bucket bound "
                         f"({', '.join(le(b) for b in M.TTFT_BUCKETS)}): the good-request count would be a guess")
    for k in ("ttft_objective", "availability_objective"):
        if not 0 < getattr(o, k) < 1:
            raise ValueError(f"{where}: {k} must be between 0 and 1 (exclusive)")
    return o


def load(path: Path = CONFIG) -> SLOConfig:
    raw = yaml.safe_load(path.read_text()) or {}
    base = raw.get("default") or {}
    default = _objective(base, {}, f"{path.name}: default")
    models = {str(m): _objective(v or {}, base, f"{path.name}: models.{m}")
              for m, v in (raw.get("models") or {}).items()}
    return SLOConfig(default, models)
