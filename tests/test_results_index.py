"""results/README.md has a row for every folder under results/ (and under results/experiments/),
and no row for a folder that is gone: a new run committed without its line fails here."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def folders() -> set[str]:
    top = {p.name for p in RESULTS.iterdir() if p.is_dir() and p.name != "experiments"}
    return top | {f"experiments/{p.name}" for p in (RESULTS / "experiments").iterdir() if p.is_dir()}


def indexed() -> list[str]:
    text = (RESULTS / "README.md").read_text()
    return re.findall(r"^\| \[([^\]]+)\]\(\1/\) \|", text, flags=re.M)


def test_every_results_folder_has_one_row_in_the_index():
    rows = indexed()
    assert len(rows) == len(set(rows)), "a folder has two rows in results/README.md"
    missing = sorted(folders() - set(rows))
    assert not missing, (
        f"results/README.md has no row for {missing}: add one (what, command, cited in, superseded by)"
    )
    gone = sorted(set(rows) - folders())
    assert not gone, f"results/README.md lists folders that are gone: {gone}"


def test_every_row_has_its_five_columns_filled():
    text = (RESULTS / "README.md").read_text()
    for line in text.splitlines():
        if re.match(r"^\| \[", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert len(cells) == 5 and all(cells), line
