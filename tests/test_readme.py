"""The README's result tables are the committed results files rendered by `gluon-survey report
--format markdown` (`make readme` writes them): a rerun never leaves them stale."""

from pathlib import Path

from gluon_survey.driver.report import REPORT_BLOCK, embed_reports

ROOT = Path(__file__).resolve().parents[1]


def test_readme_tables_are_generated_from_the_committed_results():
    text = (ROOT / "README.md").read_text()
    blocks = [m["path"] for m in REPORT_BLOCK.finditer(text)]
    assert "results/h100-ladder/results.jsonl" in blocks
    assert all((ROOT / path).exists() for path in blocks), blocks
    assert text == embed_reports(text, ROOT), "README result tables differ from results/: run `make readme`"


def test_embedding_replaces_the_block_with_the_report(tmp_path):
    import shutil

    shutil.copy(ROOT / "results/h100-ladder/results.jsonl", tmp_path / "r.jsonl")
    doc = "intro\n<!-- report r.jsonl -->\nstale numbers\n<!-- end report -->\noutro\n"
    out = embed_reports(doc, tmp_path)
    assert "stale numbers" not in out and out.startswith("intro\n") and out.endswith("outro\n")
    assert "#### fp16, B row" in out and "| 8192x8192x512 |" in out
    assert embed_reports(out, tmp_path) == out


def test_readme_names_every_mode_of_the_registry():
    """The CLI's MODES list and the ladder table say what `gluon-survey list` says: a rung added to
    the registry without a line in the README fails here."""
    import re

    from gluon_survey import registry

    text = (ROOT / "README.md").read_text()
    listed = re.search(r"MODES is a comma-separated, case-insensitive list of `([^`]+)`", text)
    assert listed, "the README's MODES sentence is gone"
    assert [m.strip() for m in listed[1].split(",")] == registry.names()
    ladder = text[text.index("## The ladder") : text.index("## Results: H100")]
    rows = re.findall(r"^\| `([^`]+)` \|", ladder, flags=re.M)
    assert rows == [m.name for m in registry.MODES if m.kind in ("gluon", "choice")]
