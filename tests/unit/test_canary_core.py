"""The canary bake (flink_jobs/canary/core.py) on request records: A/A passes at the end, a clear regression
fails early, a small one is marginal, too little data and every bad input of issue #18 is ``inconclusive`` with
its reason (never a crash or a false pass), a cause shared by both tracks is not blamed on the canary, and the
state round trip continues with the same verdict."""

from __future__ import annotations

import pickle

import numpy as np

from infersight.flink_jobs.canary.core import ALL_REGIONS, NS, Bake, BakeConfig

MODEL = "llama"
CONFIG = BakeConfig(bake_s=600.0, interval_s=30.0)


def records(rng, n, track, t0_s, *, version=None, region="us-east", slow=1.0, errors=0.01, quality=None,
            span_s=30.0):
    out = []
    ttft = rng.lognormal(np.log(0.05 * slow), 0.5, n)
    ends = np.sort(rng.uniform(t0_s, t0_s + span_s, n))
    for i in range(n):
        rec = {"model": MODEL, "region": region, "track": track,
               "model_version": version or ("v2" if track == "canary" else "v1"),
               "end_ns": int(ends[i] * NS), "ttft_s": float(ttft[i]), "e2e_s": float(ttft[i] * 10),
               "itl_p50_s": 0.01 * slow, "decode_s": 0.5 * slow, "tokens_out": 51,
               "error_type": "500" if rng.random() < errors else None}
        if quality is not None and rng.random() < 0.5:
            rec.update(quality_score=float(np.clip(rng.normal(quality, 0.1), 0, 1)), quality_sample_rate=0.5)
        out.append(rec)
    return out


def bake_run(bake, rng, looks=20, canary_n=150, stable_n=600, canary=None, stable=None, stop_on_final=True,
             first_look=0):
    verdicts = []
    for k in range(first_look, first_look + looks):
        t0 = k * CONFIG.interval_s
        bake.add_records(records(rng, canary_n, "canary", t0, **(canary or {}))
                         + records(rng, stable_n, "stable", t0, **(stable or {})))
        verdicts.append(bake.evaluate(int((t0 + CONFIG.interval_s) * NS)))
        if stop_on_final and verdicts[-1]["final"]:
            break
    return verdicts


def metric(verdict, name):
    return next(m for m in verdict["metrics"] if m["metric"] == name)


def test_identical_canary_passes_at_the_end_and_not_before():
    v = bake_run(Bake(MODEL, "us-east", 0, CONFIG), np.random.default_rng(1))
    assert [x["verdict"] for x in v[:-1]] == ["inconclusive"] * 19 and not any(x["final"] for x in v[:-1])
    assert v[-1]["verdict"] == "pass" and v[-1]["final"] and v[-1]["canary_version"] == "v2"
    ttft = metric(v[-1], "ttft_s")
    assert ttft["ci_low"] < 0 < ttft["ci_high"] and ttft["status"] == "pass"


def test_clear_critical_regression_fails_early_and_stays_failed():
    bake = Bake(MODEL, "us-east", 0, CONFIG)
    v = bake_run(bake, np.random.default_rng(2), canary={"slow": 1.5})
    assert v[-1]["verdict"] == "fail" and v[-1]["final"] and v[-1]["elapsed_s"] <= 180
    ttft = metric(v[-1], "ttft_s")
    assert ttft["status"] == "fail" and 0.3 < ttft["shift"] < 0.7 and ttft["ci_low"] > 0.05
    assert "ttft_s worse by" in v[-1]["reasons"][0]
    assert bake.evaluate(int(900 * NS)) is v[-1]  # final: later looks do not change it


def test_better_canary_passes():
    v = bake_run(Bake(MODEL, "us-east", 0, CONFIG), np.random.default_rng(3), canary={"slow": 0.7})
    assert v[-1]["verdict"] == "pass"


def test_error_regression_fails_on_the_error_ratio():
    v = bake_run(Bake(MODEL, "us-east", 0, CONFIG), np.random.default_rng(4), canary={"errors": 0.06})
    assert v[-1]["verdict"] == "fail" and metric(v[-1], "error_ratio")["status"] == "fail"


def test_quality_drop_fails_and_weights_come_from_the_sample_rate():
    v = bake_run(Bake(MODEL, "us-east", 0, CONFIG), np.random.default_rng(5), canary={"quality": 0.7},
                 stable={"quality": 0.8})
    q = metric(v[-1], "quality_score")
    assert v[-1]["verdict"] == "fail" and q["status"] == "fail" and q["shift"] < -0.05


def test_significant_but_tolerated_change_of_a_non_critical_metric_is_marginal():
    # ITL 3 % slower on every request (a constant: significant at once) but within its 5 % tolerance;
    # TPOT 8 % slower: past its tolerance, but TPOT is not critical -> marginal, not fail
    rng = np.random.default_rng(6)
    bake = Bake(MODEL, "us-east", 0, CONFIG)
    for k in range(20):
        canary = records(rng, 150, "canary", k * 30.0)
        for r in canary:
            r["itl_p50_s"] *= 1.03
            r["decode_s"] *= 1.08
        bake.add_records(canary + records(rng, 600, "stable", k * 30.0))
        v = bake.evaluate(int((k + 1) * 30 * NS))
    assert v["verdict"] == "marginal" and v["final"]
    assert metric(v, "itl_s")["status"] == "marginal" and metric(v, "tpot_s")["status"] == "fail"


def test_too_few_requests_is_inconclusive_never_pass():
    v = bake_run(Bake(MODEL, "us-east", 0, CONFIG), np.random.default_rng(7), canary_n=5, stable_n=20)
    assert v[-1]["verdict"] == "inconclusive" and v[-1]["final"]
    assert any("too few samples" in r for r in v[-1]["reasons"])


def test_canary_without_stable_counterpart():
    bake = Bake(MODEL, "us-east", 0, CONFIG)
    rng = np.random.default_rng(8)
    for k in range(20):
        bake.add_records(records(rng, 100, "canary", k * 30.0))
        v = bake.evaluate(int((k + 1) * 30 * NS))
    assert v["verdict"] == "inconclusive" and v["final"] and "no stable counterpart" in " ".join(v["reasons"])


def test_two_canaries_of_one_model_at_once():
    bake = Bake(MODEL, "us-east", 0, CONFIG)
    rng = np.random.default_rng(9)
    for k in range(20):
        t0 = k * 30.0
        bake.add_records(records(rng, 100, "canary", t0, version="v2") + records(rng, 100, "canary", t0, version="v3")
                         + records(rng, 600, "stable", t0, slow=0.5))  # would pass or fail on data alone
        v = bake.evaluate(int((t0 + 30) * NS))
    assert v["verdict"] == "inconclusive" and "two canaries" in " ".join(v["reasons"])


def test_version_label_changing_mid_bake():
    bake = Bake(MODEL, "us-east", 0, CONFIG)
    rng = np.random.default_rng(10)
    for k in range(20):
        t0 = k * 30.0
        bake.add_records(records(rng, 100, "canary", t0, version="v2" if k < 8 else "v2-hotfix")
                         + records(rng, 600, "stable", t0))
        v = bake.evaluate(int((t0 + 30) * NS))
    assert v["verdict"] == "inconclusive" and "changed mid-bake" in " ".join(v["reasons"])


def test_clock_skew_between_regions():
    bake = Bake(MODEL, ALL_REGIONS, 0, CONFIG)
    rng = np.random.default_rng(11)
    for k in range(20):
        t0 = k * 30.0
        batch = [r for region, skew in (("us-east", 0.0), ("eu-west", 300.0))
                 for r in records(rng, 100, "canary", t0 + skew, region=region)
                 + records(rng, 400, "stable", t0 + skew, region=region)]
        bake.add_records(batch)
        v = bake.evaluate(int((t0 + 30) * NS))
    assert v["verdict"] == "inconclusive" and "clock skew between regions" in " ".join(v["reasons"])


def test_requests_without_a_track():
    bake = Bake(MODEL, "us-east", 0, CONFIG)
    rng = np.random.default_rng(12)
    for k in range(20):
        t0 = k * 30.0
        untracked = records(rng, 50, "stable", t0)
        for r in untracked[:25]:
            del r["track"]
        for r in untracked[25:]:
            r["track"] = None
        bake.add_records(records(rng, 100, "canary", t0) + records(rng, 600, "stable", t0) + untracked)
        v = bake.evaluate(int((t0 + 30) * NS))
    assert v["verdict"] == "inconclusive" and "carry no track label" in " ".join(v["reasons"])


def test_overall_bake_refuses_different_region_mixes():
    bake = Bake(MODEL, ALL_REGIONS, 0, CONFIG)
    rng = np.random.default_rng(13)
    for k in range(20):
        t0 = k * 30.0  # canary only in eu-west (slower hardware), stable everywhere
        bake.add_records(records(rng, 100, "canary", t0, region="eu-west", slow=1.3)
                         + records(rng, 300, "stable", t0, region="us-east")
                         + records(rng, 300, "stable", t0, region="eu-west", slow=1.3))
        v = bake.evaluate(int((t0 + 30) * NS))
    assert v["verdict"] == "inconclusive" and "region mixes" in " ".join(v["reasons"])


def test_stable_degrading_during_the_bake_is_not_blamed_on_the_canary():
    # from minute 3 both tracks slow down 1.8x (a shared cause): same region, same time -> no fail
    bake = Bake(MODEL, "us-east", 0, CONFIG)
    rng = np.random.default_rng(14)
    for k in range(20):
        t0, slow = k * 30.0, 1.8 if k >= 6 else 1.0
        bake.add_records(records(rng, 150, "canary", t0, slow=slow) + records(rng, 600, "stable", t0, slow=slow))
        v = bake.evaluate(int((t0 + 30) * NS))
    assert v["verdict"] == "pass"


def test_records_before_the_bake_and_shadow_traffic_are_ignored():
    bake = Bake(MODEL, "us-east", int(100 * NS), CONFIG)
    rng = np.random.default_rng(15)
    bake.add_records(records(rng, 500, "stable", 0.0, slow=3.0) + records(rng, 50, "shadow", 100.0))
    assert bake.tracked == 0 and bake.untracked == 0


def test_state_round_trip_continues_identically():
    rng_a, rng_b = np.random.default_rng(16), np.random.default_rng(16)
    a = Bake(MODEL, "us-east", 0, CONFIG)
    b = Bake(MODEL, "us-east", 0, CONFIG)
    bake_run(a, rng_a, looks=5)
    bake_run(b, rng_b, looks=5)
    b = Bake.from_state(pickle.loads(pickle.dumps(b.to_state())), CONFIG)
    va = bake_run(a, rng_a, looks=15, stop_on_final=False, first_look=5)
    vb = bake_run(b, rng_b, looks=15, stop_on_final=False, first_look=5)
    assert va[-1] == vb[-1] and va[-1]["final"]
