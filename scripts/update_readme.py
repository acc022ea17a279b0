"""Rewrite the README's result blocks from the committed results files.

Every block between `<!-- report results/.../results.jsonl -->` and `<!-- end report -->` becomes
`gluon-survey report results/.../results.jsonl --format markdown`; tests/test_readme.py fails when
the README differs from what this writes. Run from anywhere: `python scripts/update_readme.py`
(or `make readme`)."""

from pathlib import Path

from gluon_survey.driver.report import embed_reports

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    readme = ROOT / "README.md"
    readme.write_text(embed_reports(readme.read_text(), ROOT))
