"""The triage report: the ranking rule, and the HTML page loaded in headless Chromium (Playwright).

The browser test needs Debian's Chromium and the playwright wheel (`bash Testing/install-browser.sh`
installs both; CI runs it first) and skips with the reason when either is missing. Images are
made from synthetic volumes only."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.cohort.batch import run_batch
from cardseg.cohort.layout import COHORT_CSV, SUBJECTS_CSV, TRIAGE_HTML
from cardseg.cohort.options import BatchOptions
from cardseg.cohort.subjects import lvef_category_cells, subject_columns
from cardseg.cohort.tables import read_table, table_columns, write_table
from cardseg.cohort import triage as T

BROWSERS = (
    "/usr/bin/chromium-headless-shell",
    "/usr/lib/chromium/chromium-headless-shell",
    "/usr/lib/chromium/headless_shell",
    "/usr/bin/chromium",
)


def find_browser():
    env = os.environ.get("CARDSEG_CHROMIUM")
    for c in ([env] if env else []) + list(BROWSERS):
        if c and os.access(c, os.X_OK):
            return c
    return None


# --------------------------------------------------------------------------------------------
# the ranking rule
# --------------------------------------------------------------------------------------------
def row(case, status="ok", agreement="", ood="", regions="", volume="", method="card"):
    return {
        "case": case,
        "status": status,
        "agreement": agreement,
        "out_of_domain": ood,
        "flagged_regions": regions,
        "flagged_volume_ml": volume,
        "method": method,
        "error": "" if status == "ok" else "boom",
    }


def test_ranking_rule():
    rows = [
        row("clean_high", agreement="0.99", ood="false", regions="0", volume="0"),
        row("uc_case", agreement="", regions="", method="uc"),
        row("flagged_high", agreement="0.97", ood="false", regions="1", volume="0.5"),
        row("ood_high", agreement="0.90", ood="true", regions="0", volume="0"),
        row("failed", status="error"),
        row("clean_low", agreement="0.95", ood="false", regions="0", volume="0"),
        row("flagged_low", agreement="0.93", ood="false", regions="2", volume="1.0"),
        row("ood_low", agreement="0.80", ood="true", regions="5", volume="3.0"),
        row("tie_more_regions", agreement="0.97", ood="false", regions="4", volume="0.1"),
        row("pending", status="pending"),
        row("no_threshold", agreement="0.94", ood="", regions="3", volume="2.0"),  # bundle without OOD threshold
    ]
    order = [r["case"] for r in T.rank_cases(rows)]
    assert order == [
        "failed",
        "pending",
        "ood_low",
        "ood_high",
        "flagged_low",
        "no_threshold",
        "tie_more_regions",
        "flagged_high",
        "clean_low",
        "clean_high",
        "uc_case",
    ]
    assert [T.reason(r) for r in T.rank_cases(rows)][:6] == [
        "failed",
        "not run",
        "out of domain",
        "out of domain",
        "2 flagged regions",
        "3 flagged regions",
    ]


# --------------------------------------------------------------------------------------------
# the page in a real browser
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, tiny_bundle, synthetic_volume):
    """A real batch of three synthetic cases and a broken one; then the table's trust values are
    set by hand (the untrained bundle gives nearly equal agreements and no OOD threshold) and the
    report is rewritten from them, with subjects.csv holding indices with intervals."""
    vol, _ = synthetic_volume
    root = tmp_path_factory.mktemp("triage")
    (root / "in").mkdir()
    for i, name in enumerate(("alpha", "beta", "gamma")):
        arr = np.roll(vol.array, 5 * i, axis=2) * (1.0 + 0.1 * i)
        sitk.WriteImage(vol.to_image(arr.astype(np.float32)), str(root / "in" / f"{name}.nii.gz"))
    (root / "in" / "delta.nii.gz").write_bytes(b"not an image")
    out = root / "out with space"
    result = run_batch(
        BatchOptions(inputs=[str(root / "in")], output=str(out), bundle=str(tiny_bundle), progress="none")
    )
    assert (out / TRIAGE_HTML).is_file()
    rows = {r["case"]: dict(r) for r in result.rows}
    rows["alpha"].update(agreement=0.97, out_of_domain=False, flagged_regions=0, flagged_volume_ml=0.0)
    rows["beta"].update(agreement=0.95, out_of_domain=True, flagged_regions=1, flagged_volume_ml=0.2)
    rows["gamma"].update(
        agreement=0.91, out_of_domain=False, flagged_regions=3, flagged_volume_ml=1.5, subject="s1", phase="ED"
    )
    columns = table_columns(list(rows.values()), ["RV", "MYO", "LV"])
    write_table(out / COHORT_CSV, list(rows.values()), columns)
    write_table(
        out / SUBJECTS_CSV,
        [
            {
                "subject": "s1",
                "ed_case": "gamma",
                "es_case": "alpha",
                "nominal": 0.9,
                "LVEF": 57.25,
                "LVEF_low": 45.0,
                "LVEF_high": 64.75,
                "LVEDV_ml": 151.0,
                "LVEDV_ml_low": 140.0,
                "LVEDV_ml_high": 162.0,
                "error": "",
                **lvef_category_cells({"low": 45.0, "high": 64.75}),
            }
        ],
        subject_columns(["LVEDV_ml", "LVEF"]),
    )
    from cardseg.bundle.folder import check_bundle_folder

    _, config = check_bundle_folder(tiny_bundle)
    T.write_report(out, config=config)
    return out


def expected_order(out: Path):
    """The documented rule, written again here: failed, then out of domain, then with flagged
    regions, then clean; lower agreement first within each."""
    with open(out / COHORT_CSV, newline="") as f:
        rows = list(csv.DictReader(f))

    def key(r):
        if r["status"] != "ok":
            return (0, 0.0)
        tier = 1 if r["out_of_domain"] == "true" else (2 if int(r["flagged_regions"] or 0) > 0 else 3)
        return (tier, float(r["agreement"]))

    return [r["case"] for r in sorted(rows, key=key)]


@pytest.fixture(scope="module")
def page(report_dir):
    pw = pytest.importorskip("playwright.sync_api", reason="playwright not installed (bash Testing/install-browser.sh)")
    browser_path = find_browser()
    if browser_path is None:
        pytest.skip("no Chromium installed (bash Testing/install-browser.sh)")
    with pw.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, headless=True)
        pg = browser.new_page()
        requests = []
        pg.on("request", lambda r: requests.append(r.url))
        url = (report_dir / TRIAGE_HTML).resolve().as_uri()
        pg.goto(url)
        pg.wait_for_load_state("load")
        yield {"page": pg, "requests": requests, "url": url, "dir": report_dir}
        browser.close()


def test_page_ranks_least_trusted_first(page):
    pg = page["page"]
    cases = pg.eval_on_selector_all("tr.case", "rows => rows.map(r => r.dataset.case)")
    assert cases == ["delta", "beta", "gamma", "alpha"] == expected_order(page["dir"])
    ranks = pg.eval_on_selector_all("tr.case td.rank", "cells => cells.map(c => c.textContent.trim())")
    assert ranks == ["1", "2", "3", "4"]
    reasons = pg.eval_on_selector_all("tr.case td.reason", "cells => cells.map(c => c.innerText)")
    assert reasons[0].startswith("failed") and "delta.nii.gz" in reasons[0]
    assert reasons[1] == "out of domain" and reasons[2] == "3 flagged regions" and reasons[3] == "no flagged region"
    assert pg.inner_text("#n-cases") == "4" and pg.inner_text("#n-failed") == "1" and pg.inner_text("#n-ood") == "1"


def test_page_shows_a_thumbnail_per_segmented_case(page):
    pg = page["page"]
    for case in ("alpha", "beta", "gamma"):
        img = pg.locator(f'tr.case[data-case="{case}"] img.thumbnail')
        assert img.count() == 1
        assert img.get_attribute("src").startswith("data:image/png;base64,")
        assert img.evaluate("i => i.complete && i.naturalWidth") == T.THUMB_PX[0]  # the PNG decoded
        assert "slice" in pg.inner_text(f'tr.case[data-case="{case}"] .caption')
    assert pg.locator('tr.case[data-case="delta"] img').count() == 0


def test_page_shows_indices_with_intervals(page):
    text = page["page"].inner_text('tr.case[data-case="gamma"] td.indices')
    assert "LVEF 57.2 % [45.0, 64.8]" in text and "LVEDV 151.0 ml [140.0, 162.0]" in text and "90 %" in text
    assert "LVEF 45-65%: mildly reduced or preserved" in text and "straddles a threshold" in text
    assert page["page"].inner_text('tr.case[data-case="alpha"] td.indices') == ""  # no subject


def test_page_is_self_contained(page):
    assert page["requests"] and all(u.startswith(("file://", "data:")) for u in page["requests"]), page["requests"]
    html = (page["dir"] / TRIAGE_HTML).read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html.lower()


def test_page_links_open_the_case_folders(page):
    pg = page["page"]
    for case in ("alpha", "beta", "gamma", "delta"):
        href = pg.locator(f'tr.case[data-case="{case}"] a.case-folder').evaluate("a => a.href")
        assert href == (page["dir"] / case).resolve().as_uri() + "/"
    report_href = pg.locator('tr.case[data-case="beta"] a.case-report').evaluate("a => a.href")
    assert pg.locator('tr.case[data-case="delta"] a.case-report').count() == 0  # failed: no report
    pg.locator('tr.case[data-case="beta"] a.case-folder').click()
    pg.wait_for_load_state("load")
    assert pg.url == (page["dir"] / "beta").resolve().as_uri() + "/"
    assert "report.json" in pg.content()  # the folder's listing
    pg.goto(report_href)
    assert '"agreement"' in pg.content()
    pg.goto(page["url"])


def test_report_shows_the_lvef_category_and_flags_straddling(report_dir, tmp_path):
    """Without a browser: the category the interval implies, the straddle mark and the count, from
    subjects.csv; an interval inside one category is shown without the mark."""
    html = (report_dir / TRIAGE_HTML).read_text()
    assert html.count("LVEF 45-65%: mildly reduced or preserved &middot; straddles a threshold") == 1
    assert '<b id="n-straddling">1</b>' in html
    out = tmp_path / "one-category"
    shutil.copytree(report_dir, out)
    rows = read_table(out / SUBJECTS_CSV)
    rows[0].update(LVEF_low=51.0, **lvef_category_cells({"low": 51.0, "high": 64.75}))
    write_table(out / SUBJECTS_CSV, rows, list(rows[0]))
    html = T.write_report(out).read_text()
    assert "LVEF 51-65%: preserved</div>" in html and "straddles a threshold</div>" not in html
    assert '<b id="n-straddling">0</b>' in html


def test_report_without_matplotlib_still_lists_cases(report_dir, tmp_path, monkeypatch):
    import builtins

    out = tmp_path / "copy"
    shutil.copytree(report_dir, out)
    real_import = builtins.__import__

    def no_mpl(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    html = T.write_report(out).read_text()
    assert html.count('class="case tier-') == 4 and "matplotlib is not installed" in html


def test_report_lists_the_first_regions_with_ml_and_p_error(report_dir, tmp_path):
    """Without a browser: each case's first regions in review order, volume and p_error, from
    cohort.csv's region<k> columns; a missing p_error is left out, a table without the columns
    (written before them) shows none."""
    import re

    out = tmp_path / "regions"
    shutil.copytree(report_dir, out)
    rows = read_table(out / COHORT_CSV)
    for r in rows:
        r.update({f"region{k}_{w}": "" for k in (1, 2, 3) for w in ("ml", "p_error")})
    gamma = next(r for r in rows if r["case"] == "gamma")
    gamma.update(region1_ml=12.34, region1_p_error=0.853, region2_ml=3.0, region2_p_error="")
    write_table(out / COHORT_CSV, rows, list(rows[0]))
    html = T.write_report(out).read_text()
    cells = dict(re.findall(r'data-case="(\w+)".*?<td class="num regions">(.*?)</td>', html, re.S))
    assert re.search(
        r"<ol class=\"top-regions\"[^>]*><li>12\.3 ml, p_error 0\.85</li><li>3\.0 ml</li></ol>", cells["gamma"]
    )
    assert "top-regions" not in cells["alpha"] and "top-regions" not in cells["beta"]
    old = [{k: v for k, v in r.items() if not k.startswith("region")} for r in rows]
    write_table(out / COHORT_CSV, old, list(old[0]))
    assert 'class="top-regions"' not in T.write_report(out).read_text()


def test_top_regions_reads_the_cells_in_order():
    row = {
        "region1_ml": "4.5",
        "region1_p_error": "0.7",
        "region2_ml": "2",
        "region2_p_error": "nan",
        "region3_ml": "",
        "region3_p_error": "0.1",
    }
    assert T.top_regions(row) == [(4.5, 0.7), (2.0, None)]
    assert T.top_regions({}) == []


def test_cohort_row_describes_the_first_three_regions():
    from cardseg.cohort.tables import top_region_cells

    regions = [
        {"volume_mm3": 2500.0, "p_error": 0.9},
        {"volume_mm3": 1000.0, "p_error": None},
        {"volume_mm3": 500.0, "p_error": 0.2},
        {"volume_mm3": 9999.0, "p_error": 0.99},
    ]
    cells = top_region_cells(regions)
    assert cells == {
        "region1_ml": 2.5,
        "region1_p_error": 0.9,
        "region2_ml": 1.0,
        "region2_p_error": None,
        "region3_ml": 0.5,
        "region3_p_error": 0.2,
    }  # the fourth region is not described
    assert all(v is None for v in top_region_cells(regions[:0]).values())
    assert top_region_cells(regions[:1])["region2_ml"] is None
