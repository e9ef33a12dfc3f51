"""The request core as named data: a request captures, ``summarise`` (pure) turns the capture into a
``RequestSummary``, and the root span and the record are built from it with the contract's names. Also:
no instrumentation module reads another's private fields."""

from __future__ import annotations

import ast
import gc
from dataclasses import fields
from pathlib import Path
from types import FunctionType, ModuleType, SimpleNamespace

import pytest
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from infersight.instrumentation.summary import ItlSummary, RequestSummary, summarise
from infersight.schemas import attributes as A
from infersight.schemas.contract import ITL_FIELDS, REQUEST_FIELDS
from infersight.schemas.units import MS
from tests.unit.test_instrumentation_spans import Harness, run_request

REPO = Path(__file__).resolve().parents[2]


def _stage(name: str, start_ms: float, end_ms: float) -> SimpleNamespace:
    return SimpleNamespace(name=name, start_ns=int(start_ms * MS), end_ns=int(end_ms * MS))


def test_summarise_is_a_pure_function_of_what_was_captured():
    stages = [_stage("routing", 0, 1), _stage("queue", 1, 11), _stage("prefill", 13, 33), _stage("decode", 33, 90)]
    times = [33 * MS, 43 * MS, 53 * MS, 63 * MS, 113 * MS]
    args = ("llama", "chat", 0, 126 * MS, 10**18, times, stages, 40, None, 32, 64, "length", None, "llama-v2",
            "chatcmpl-1")
    s = summarise(*args)
    assert summarise(*args) == s  # same capture, same summary
    assert (s.model, s.operation, s.start_ns, s.end_ns) == ("llama", "chat", 10**18, 10**18 + 126 * MS)
    assert s.e2e_s == pytest.approx(0.126) and s.ttft_s == pytest.approx(0.033)
    assert s.queue_s == pytest.approx(0.010) and s.prefill_s == pytest.approx(0.020)
    assert s.decode_s == pytest.approx(0.057)  # the decode stage, not first to last token
    assert s.tpot_s == pytest.approx(0.020)
    assert s.itl == ItlSummary(4, pytest.approx(0.020), pytest.approx(0.010), pytest.approx(0.050),
                               pytest.approx(0.050), pytest.approx(0.050))
    assert (s.tokens_in, s.tokens_out, s.tokens_cached, s.prefix_queried) == (40, 5, 32, 64)  # out: the marks
    assert (s.finish_reason, s.error_type, s.response_model, s.response_id) == ("length", None, "llama-v2",
                                                                                 "chatcmpl-1")
    assert [st.start_ns for st in stages] == [0, 1 * MS, 13 * MS, 33 * MS] and times[0] == 33 * MS  # untouched
    none = summarise("m", "chat", 5, 5 + 3 * MS, 0, [], [], None, 0, 0, 0, "error", "Boom", None, None)
    assert (none.ttft_s, none.tpot_s, none.decode_s, none.itl, none.tokens_out) == (None, None, None, None, 0)


def test_the_request_summary_is_a_slots_dataclass_and_the_itl_summary_has_the_contracts_fields():
    assert not hasattr(RequestSummary(*(None,) * len(fields(RequestSummary))), "__dict__")
    assert tuple(f"itl_{name}" for name in ItlSummary._fields) == tuple(f.name for f in ITL_FIELDS)


def test_a_finished_request_gives_its_summary_and_stages_as_named_data():
    h = Harness()
    req = run_request(h)
    s = req.summary()
    assert isinstance(s, RequestSummary) and s.finish_reason == "length" and s.itl.count == 5
    assert s.itl.p90_s == pytest.approx(0.050) and s.tokens_out == 6
    spans = h.spans()
    assert spans["queue"].end_time - spans["queue"].start_time == 10 * MS
    stage = req.stage("queue")  # after finish: counted, not kept
    assert (stage.name, stage.end_ns, stage.attributes) == ("queue", None, None) and stage.start_ns > 0


def test_root_span_attributes_carry_the_record_under_the_contracts_names():
    for sampler in (None, ALWAYS_OFF):  # the traced root and the record-only root
        h = Harness(sampler=sampler) if sampler else Harness()
        req = run_request(h)
        attrs = h.spans()["chat llama"].attributes
        record = req.record()
        carried = [f for f in REQUEST_FIELDS if f.attribute in attrs]
        for f in carried:
            value = attrs[f.attribute]
            expected = getattr(record, f.name)
            if f.name == "finish_reason":
                assert value == (expected,)
            elif f.type == "double":
                assert value == pytest.approx(expected), f.name
            else:
                assert value == expected, f.name
        # the region is the resource's (the gateway stamps it); error.type only on a failed request
        assert {f.name for f in REQUEST_FIELDS if f.attribute} - {f.name for f in carried} == {"region", "error_type"}
        assert attrs[A.TPOT] == pytest.approx(req.summary().tpot_s)


def _reaches(start: object, target: object, limit: int = 200_000) -> bool:
    """Whether ``target`` is reachable from ``start``'s references (modules, classes and functions not
    followed: they lead to the whole interpreter, never back to a request through its own data)."""
    seen, todo = {id(start)}, list(gc.get_referents(start))
    while todo and len(seen) < limit:
        obj = todo.pop()
        if obj is target:
            return True
        if id(obj) in seen or isinstance(obj, ModuleType | type | FunctionType):
            continue
        seen.add(id(obj))
        todo.extend(gc.get_referents(obj))
    return False


def test_a_request_and_its_stages_form_no_reference_cycle():
    """Freed by reference counting when done, never left for the garbage collector (every request)."""
    for sampler in (None, ALWAYS_OFF):
        h = Harness(sampler=sampler) if sampler else Harness()
        with h.inst.request("llama") as req:
            stage = req.stage("queue")
            stage.end()
            req.first_token()
            req.token()
        assert not _reaches(req, req)
        assert not _reaches(stage, req)


def _private_names_defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: ``self._x`` assignments, ``__slots__`` entries, class attributes and
    methods, module-level names."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) \
                and node.value.id == "self":
            names.add(node.attr)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                  for t in node.targets):
            names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_instrumentation_module_reads_another_modules_private_fields():
    modules = {p: ast.parse(p.read_text()) for p in sorted((REPO / "instrumentation").rglob("*.py"))}
    defined = {p: _private_names_defined(tree) for p, tree in modules.items()}
    bad = []
    for path, tree in modules.items():
        others = set().union(*(names for p, names in defined.items() if p != path)) - defined[path]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in others
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                bad.append(f"{path.relative_to(REPO)}:{node.lineno} .{node.attr}")
    assert not bad, bad
