"""Rewrite the result blocks of README.md and docs/results.md from the committed results files.

Every block between `<!-- report results/.../results.jsonl -->` and `<!-- end report -->` becomes
`gluon-survey report results/.../results.jsonl --format markdown`, and a block opened by
`<!-- report results/.../results.jsonl summary -->` its one-table summary (report.format_summary),
and a block between `<!-- model FILE,... -->` and `<!-- end model -->` the summary of those
`gluon-survey model` runs (driver/model.py, `format_summary`); tests/test_readme.py fails when
either file differs from what this writes. Run from anywhere: `python scripts/update_readme.py`
(or `make readme`)."""

from pathlib import Path

from gluon_survey.driver.model import embed_summaries
from gluon_survey.driver.report import embed_reports

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/results.md")  # paths in their blocks are relative to ROOT

if __name__ == "__main__":
    for name in DOCUMENTS:
        path = ROOT / name
        path.write_text(embed_summaries(embed_reports(path.read_text(), ROOT), ROOT))
