"""The built documentation in a real browser (headless Chromium through playwright, as the triage
page's tests): the index opens with its navigation, and a results page shows a table generated
from the result files with the line naming its file. Skips when the browser or the [docs] extra
is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_triage_html import find_browser

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import cardseg_results as results  # noqa: E402


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory):
    pytest.importorskip("sphinx", reason="the [docs] extra is not installed")
    pw = pytest.importorskip("playwright.sync_api", reason="playwright not installed (bash Testing/install-browser.sh)")
    path = find_browser()
    if path is None:
        pytest.skip("no Chromium installed (bash Testing/install-browser.sh)")
    out = tmp_path_factory.mktemp("docs-html")
    r = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, headless=True)
        yield out, browser.new_page()
        browser.close()


@pytest.mark.slow
def test_the_index_opens_with_its_sections(browser_page):
    out, page = browser_page
    page.goto((out / "index.html").as_uri())
    page.wait_for_load_state("load")
    assert "CARDSegment" in page.title()
    nav = page.inner_text("body").lower()  # the theme shows the captions in capitals
    for section in ("getting started", "how-to guides", "reference", "explanation", "results"):
        assert section in nav


@pytest.mark.slow
def test_a_results_page_shows_a_generated_table(browser_page):
    out, page = browser_page
    page.goto((out / "results" / "index.html").as_uri())
    page.wait_for_load_state("load")
    tables = page.locator("table.result-table")
    assert tables.count() >= 5
    first = tables.first
    assert first.is_visible()
    dice = json.loads(results.resolve_file("@shipped/test/dice.json").path.read_text(encoding="utf-8"))
    cells = first.locator("td").all_inner_texts()
    assert f"{dice['summary']['mean']:.3f}" in cells
    note = page.locator("p.result-source").first.inner_text()
    assert "Training/results/" in note and "dice.json" in note and "frozen at commit" in note
