"""The generated reference page is committed and current."""

from __future__ import annotations

from infersight.schemas import reference
from infersight.schemas.metrics import TTFT_BUCKETS
from infersight.schemas.registry import entries


def test_committed_page_equals_generator_output():
    assert reference.DEFAULT_PATH.read_text(encoding="utf-8") == reference.render(), (
        "docs/telemetry-reference.md is stale: run python -m infersight.schemas.reference")


def test_page_lists_every_name_and_the_buckets():
    page = reference.render()
    for entry in entries():
        assert f"`{entry.name}`" in page
    assert ", ".join(f"{b:.10g}" for b in TTFT_BUCKETS) in page


def test_check_mode_detects_a_stale_page(tmp_path):
    path = tmp_path / "ref.md"
    assert reference.main([str(path), "--check"]) == 1
    assert reference.main([str(path)]) == 0
    assert reference.main([str(path), "--check"]) == 0
    path.write_text(path.read_text() + "edited\n")
    assert reference.main([str(path), "--check"]) == 1
