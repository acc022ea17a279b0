"""The result tables of README.md and docs/results.md are the committed results files rendered by
`gluon-survey report --format markdown` (`make readme`, scripts/update_readme.py, writes them): a
rerun never leaves them stale. docs/usage.md's list of modes and the README's ladder say what the registry
says."""

import re
from pathlib import Path

import pytest

from gluon_survey.driver.report import REPORT_BLOCK, embed_reports

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/results.md")  # the files scripts/update_readme.py writes


def test_update_readme_writes_the_documents_checked_here():
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts/update_readme.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.DOCUMENTS == DOCUMENTS


@pytest.mark.parametrize("name", DOCUMENTS)
def test_result_tables_are_generated_from_the_committed_results(name):
    text = (ROOT / name).read_text()
    blocks = [path for m in REPORT_BLOCK.finditer(text) for path in m["path"].split(",")]
    assert blocks, f"{name} has no report block"
    assert all((ROOT / path).exists() for path in blocks), blocks
    assert text == embed_reports(text, ROOT), f"{name}: result tables differ from results/: run `make readme`"


def test_the_full_tables_are_in_docs_results_and_the_readme_has_the_headline():
    full = [m["path"] for m in REPORT_BLOCK.finditer((ROOT / "docs/results.md").read_text())]
    assert "results/h100-ladder/results.jsonl" in full and "results/h100-llm-auto/results.jsonl" in full
    assert "results/h100-dense-auto/bf16/results.jsonl" in full
    assert "results/h100-dense-sweep/bf16/results.jsonl" in full
    readme = list(REPORT_BLOCK.finditer((ROOT / "README.md").read_text()))
    # The headline is a bf16 sweep over every token count (not over the points the table was tuned
    # at only), and docs/results.md carries the same run's table.
    (headline,) = readme
    assert re.fullmatch(r"results/h100-dense-sweep/bf16(-\w+)?/results\.jsonl", headline["path"])
    assert headline["form"] == "summary" and headline["path"] in full


@pytest.mark.parametrize("name", DOCUMENTS)
def test_the_model_tables_are_generated_from_the_committed_runs(name):
    """Any model table (docs/results.md has them; the README may) is the committed runs' summary."""
    from gluon_survey.driver.model import MODEL_BLOCK, embed_summaries

    text = (ROOT / name).read_text()
    blocks = [m["paths"].split(",") for m in MODEL_BLOCK.finditer(text)]
    assert blocks or name == "README.md", f"{name} has no model table"
    assert all((ROOT / p).exists() for paths in blocks for p in paths), blocks
    assert text == embed_summaries(text, ROOT), f"{name}: a model table differs from results/: make readme"


def test_readme_stays_short():
    """What, quick start, API, the ladder, one headline table: the rest lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_embedding_replaces_the_block_with_the_report(tmp_path):
    import shutil

    shutil.copy(ROOT / "results/h100-ladder/results.jsonl", tmp_path / "r.jsonl")
    doc = "intro\n<!-- report r.jsonl -->\nstale numbers\n<!-- end report -->\noutro\n"
    out = embed_reports(doc, tmp_path)
    assert "stale numbers" not in out and out.startswith("intro\n") and out.endswith("outro\n")
    assert "#### fp16, B row" in out and "| 8192x8192x512 |" in out
    assert embed_reports(out, tmp_path) == out


def test_usage_and_the_readme_name_every_mode_of_the_registry():
    """The CLI's MODES list (docs/usage.md) and the README's ladder table say what `gluon-survey
    list` says: a rung added to the registry without a line in both fails here."""
    from gluon_survey import registry

    usage = (ROOT / "docs" / "usage.md").read_text()
    listed = re.search(r"MODES is a comma-separated, case-insensitive list of `([^`]+)`", usage)
    assert listed, "docs/usage.md's MODES sentence is gone"
    assert [m.strip() for m in listed[1].split(",")] == registry.names()
    text = (ROOT / "README.md").read_text()
    start = text.index("## The ladder")
    ladder = text[start : text.index("\n## ", start)]
    rows = re.findall(r"^\| `([^`]+)` \|", ladder, flags=re.M)
    assert rows == [m.name for m in registry.MODES if m.kind in ("gluon", "choice")]


def test_readme_and_results_speak_of_capabilities_not_issue_numbers():
    for name in DOCUMENTS:
        assert not re.search(r"\bissues? ?#?\d", (ROOT / name).read_text(), flags=re.I), name
