"""bench/multiregion.py's highest zero-loss rate: rising steps stop at the first not held, falling ones (the
freshness step did not hold) at the first held; the freshness step's own rate counts when it held."""

from __future__ import annotations

import bench.multiregion as B


def _steps(monkeypatch, holds_up_to: float) -> list[float]:
    tried: list[float] = []

    def measure(stack, rate, step_s):
        tried.append(rate)
        return {"held": rate <= holds_up_to, "not_held_because": None, "sent": 1, "lost": 0, "double": 0,
                "freshness_p50_s": 1.0, "freshness_p99_s": 2.0}

    monkeypatch.setattr(B, "measure", measure)
    return tried


def test_rising_steps_stop_at_the_first_not_held_and_the_freshness_step_counts(monkeypatch):
    tried = _steps(monkeypatch, holds_up_to=8000)
    out = B.max_zero_loss_rate(None, [8000, 10000, 12000], 60, held=5000)
    assert tried == [8000, 10000] and out["max_zero_loss_rate"] == 8000
    tried.clear()
    out = B.max_zero_loss_rate(None, [10000], 60, held=5000)  # none above holds: the freshness step's rate
    assert out["max_zero_loss_rate"] == 5000


def test_falling_steps_stop_at_the_first_held(monkeypatch):
    tried = _steps(monkeypatch, holds_up_to=3500)
    out = B.max_zero_loss_rate(None, [3500, 2000], 60, falling=True)
    assert tried == [3500] and out["max_zero_loss_rate"] == 3500
    tried.clear()
    out = B.max_zero_loss_rate(None, [3000], 60, falling=True)
    assert out["max_zero_loss_rate"] == 3000
    tried.clear()
    _steps(monkeypatch, holds_up_to=0)
    assert B.max_zero_loss_rate(None, [3000, 2000], 60, falling=True)["max_zero_loss_rate"] == 0.0
