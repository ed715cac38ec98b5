"""docs/results.md and bench/results/README.md are what their scripts make from the committed run records, every
record they cite exists, and every relative link of README.md, docs/ and the records' index resolves.

CPU only, a few seconds: make_results.py runs without plots; the `cad simulate` section is regenerated where the
test is given the built CLI (CAD_CLI) and the document-length data (CAD_DATA), else left out of the comparison.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest
from script_module import load_script

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
PREDICTED = "## Predicted against measured"


def _load(name):
    sys.path.insert(0, str(RESULTS))
    return load_script(RESULTS / f"{name}.py")


def _tables(text, with_predicted):
    """The page's table rows and citation lines (what carries numbers), optionally without the simulate section."""
    if not with_predicted:
        text = text.split(PREDICTED)[0]
    return [line for line in text.splitlines() if line.startswith("|") or line.startswith(("Record", "Each rank"))]


def test_index_is_made_from_the_records():
    run = subprocess.run([sys.executable, str(RESULTS / "index.py"), "--check"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_index_refuses_a_record_without_its_fields(tmp_path, monkeypatch):
    index = _load("index")
    (tmp_path / "some_record").mkdir()
    (tmp_path / "some_record" / "README.md").write_text("# some record\n\n- Date: 2026-12-01\n- Commit: abc1234\n")
    monkeypatch.setattr(index, "HERE", str(tmp_path))
    with pytest.raises(ValueError, match=r"some_record/README.md: no '- Machine:' line"):
        index.render()


def test_results_page_is_made_from_the_records(tmp_path):
    cmd = [sys.executable, str(RESULTS / "make_results.py"), "--no-plots", "--out", str(tmp_path)]
    cli, dist = os.environ.get("CAD_CLI"), os.environ.get("CAD_DATA")
    with_predicted = bool(cli and dist and os.path.exists(cli) and os.path.exists(dist))
    cmd += ["--cad", cli, "--dist", dist] if with_predicted else ["--cad", str(tmp_path / "no_cad")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    made = (tmp_path / "results.md").read_text()
    committed = (REPO / "docs" / "results.md").read_text()
    assert _tables(made, with_predicted) == _tables(committed, with_predicted), \
        "docs/results.md differs from what bench/results/make_results.py makes: run it and commit the page"
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- results-table:begin -->\n", 1)[1].split("<!-- results-table:end -->", 1)[0]
    assert block == (tmp_path / "headline.md").read_text(), \
        "README.md's results table differs from what bench/results/make_results.py makes: run it and commit README.md"
    for record in re.findall(r"\]\(bench/results/([^)/]+)/\)", block):
        assert (RESULTS / record / "README.md").is_file(), f"README.md cites bench/results/{record}, which is missing"
    rows = [line for line in _tables(made, False) if re.match(r"\| (\d+K|\d+) \|", line)]
    assert len(rows) >= 8, "the step, memory and kernel tables are nearly empty"
    for record in re.findall(r"\]\(\.\./bench/results/([^)/]+)/\)", committed):
        assert (RESULTS / record / "README.md").is_file(), f"docs/results.md cites bench/results/{record}, which is missing"
    for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", committed):
        assert (REPO / "docs" / image).is_file(), f"docs/results.md shows {image}, which is missing"


def test_results_page_refuses_a_missing_record():
    mr = _load("make_results")
    mr.STEP_RECORDS = {2: ["no_such_record_h200x2/a"]}
    with pytest.raises(ValueError, match="bench/results/no_such_record_h200x2/a: no such folder"):
        mr.step_rows(2)


def _links(md):
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text)]


def test_every_relative_link_resolves():
    pages = [REPO / "README.md", RESULTS / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken = []
    for md in pages:
        for target in _links(md):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            if not (md.parent / target.split("#")[0]).exists():
                broken.append(f"{md.relative_to(REPO)}: {target}")
    assert not broken, "broken relative links:\n" + "\n".join(broken)


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[there](missing.md) and [code](`x`)\n```\n[not a link](nowhere.md)\n```\n")
    assert _links(page) == ["missing.md", "`x`"]


# Words of the project's own bookkeeping that a user page must not carry: issue numbers, numbered runs ("run 23";
# a record is named by its folder instead), branch names of work in progress, and the names of the machinery that
# schedules work. Records under bench/results keep their history; the user pages say what is current.
_LABELS = re.compile(r"\bissues? #?\d+|\bruns? \d+(?:-\d+)?(?![\d.x%])|\bwip-[a-z]|\bkernels-\d|\.devrun|"
                     r"\bsessions?\b|\bagents?\b", re.I)


def _labels(md):
    return [m.group(0) for m in _LABELS.finditer(md.read_text())]


def test_user_pages_carry_no_internal_labels():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = [f"{md.relative_to(REPO)}: {label!r}" for md in pages for label in _labels(md)]
    assert not found, "internal labels on user pages (name the record, the commit or the option instead):\n" + \
        "\n".join(found)


def test_the_label_check_sees_a_label(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("as run 23 showed (issue 14, branch wip-bal); 4 runs, 1.045x; runs 1.5x faster; 2 work items\n")
    assert _labels(page) == ["run 23", "issue 14", "wip-b"]
