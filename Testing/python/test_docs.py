"""The documentation: built with warnings as errors, every generated number traced to the file it
names (the pages' tables and values, the README's headline table, the model card), the command-line
reference holding every option ``--help`` shows, and the README short, with no issue numbers."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS / "tools"))

import cardseg_results as results  # noqa: E402
import generate  # noqa: E402

DIRECTIVE = re.compile(r"```\{result-table\}\n(?P<options>(?::[\w-]+:.*\n)+)```")
ROLE = re.compile(r"\{result\}`(?P<ref>[^`]+)`")
ISSUE = re.compile(r"\bissues?\s+#?\d+|(?<![\w&])#\d+\b", re.IGNORECASE)


def _pages():
    return sorted(p for p in DOCS.rglob("*.md") if "build" not in p.relative_to(DOCS).parts)


def _options(block: str) -> dict:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^:([\w-]+):(.*)$", block, re.MULTILINE)}


class _Tables(HTMLParser):
    """The cells of every ``table.result-table`` of a page, in order: ``[[row cells], ...]`` each."""

    def __init__(self):
        super().__init__()
        self.tables, self._depth, self._cell = [], 0, None

    def handle_starttag(self, tag, attrs):
        classes = dict(attrs).get("class", "") or ""
        if tag == "table" and "result-table" in classes.split():
            self.tables.append([])
            self._depth = 1
        elif self._depth and tag == "tr":
            self.tables[-1].append([])
        elif self._depth and tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if self._depth and tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif self._depth and tag == "table":
            self._depth = 0

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _expected_rows(opts: dict) -> list:
    """A ``result-table``'s body as the result files give it, computed here from the options."""
    path = opts.get("path", "{col}")
    cols = [(k, (lab.partition("|")[2] or opts.get("format", ""))) for k, lab in _pairs(opts["columns"])]
    if opts["rows"].startswith("@"):
        pointer, _, key = opts["rows"][1:].partition("|")
        items = results.lookup(results.load(results.resolve_file(opts["file"]).path), pointer)
        rows = [(f"{pointer.strip('/')}/{i}", str(item[key])) for i, item in enumerate(items)]
    else:
        rows = _pairs(opts["rows"])
    body = []
    for rkey, rlabel in rows:
        cells = [rlabel]
        for ckey, fmt in cols:
            fill = lambda t: t.replace("{col}", ckey).replace("{row}", rkey)  # noqa: E731
            data = json.loads(results.resolve_file(fill(opts["file"])).path.read_text(encoding="utf-8"))
            cells.append(results.format_value(results.lookup(data, fill(path)), fmt))
        body.append(cells)
    return body


def _pairs(text: str):
    out = []
    for item in [t.strip() for t in text.split(";") if t.strip()]:
        key, _, label = item.partition("=")
        out.append((key.strip(), (label or key).strip()))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The documentation built from scratch with warnings as errors: its HTML folder."""
    pytest.importorskip("sphinx", reason="the [docs] extra is not installed")
    pytest.importorskip("myst_parser", reason="the [docs] extra is not installed")
    out = tmp_path_factory.mktemp("docs-html")
    # built as a reader builds it: the suite's private model cache (a random folder name, whose
    # underscores reStructuredText would read as links where a page shows the cache) stays out
    env = {k: v for k, v in os.environ.items() if k != "CARDSEG_CACHE_DIR"}
    r = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.mark.slow
def test_every_generated_table_holds_its_files_numbers(built):
    checked = 0
    for page in _pages():
        blocks = [_options(m.group("options")) for m in DIRECTIVE.finditer(page.read_text(encoding="utf-8"))]
        if not blocks:
            continue
        html_page = built / page.relative_to(DOCS).with_suffix(".html")
        parser = _Tables()
        parser.feed(html_page.read_text(encoding="utf-8"))
        assert len(parser.tables) == len(blocks), (
            f"{page.name}: {len(blocks)} result tables, {len(parser.tables)} built"
        )
        for opts, table in zip(blocks, parser.tables):
            body = [[html.unescape(c) for c in row] for row in table[1:]]
            assert body == _expected_rows(opts), f"{page.name}: the table from {opts['file']} differs from the file"
            checked += 1
    assert checked >= 10


@pytest.mark.slow
def test_every_generated_value_in_the_pages_comes_from_its_file(built):
    checked = 0
    for page in _pages():
        refs = [m.group("ref") for m in ROLE.finditer(page.read_text(encoding="utf-8"))]
        if not refs:
            continue
        text = html.unescape((built / page.relative_to(DOCS).with_suffix(".html")).read_text(encoding="utf-8"))
        for ref in refs:
            value, _ = results.value_of(ref)
            assert f'<span class="result-value">{value}</span>' in text, f"{page.name}: {ref} should read {value}"
            checked += 1
    assert checked >= 10


@pytest.mark.slow
def test_the_model_card_is_in_the_pages(built):
    text = (built / "results" / "model-card.html").read_text(encoding="utf-8")
    version = json.loads(results.SHIPPED_BUNDLE.read_text(encoding="utf-8"))["id"]["version"]
    assert f"acdc</span></code> {version}" in text or f"acdc {version}" in html.unescape(re.sub(r"<[^>]+>", "", text))


def test_model_card_and_readme_table_match_the_result_files():
    r = subprocess.run([sys.executable, str(DOCS / "tools" / "generate.py"), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_changed_result_file_changes_the_generated_text(monkeypatch):
    """Each number of the model card and of the README's table is read from its file: change one
    value in a result file and the generated text changes with it, so --check would fail."""
    source = results.resolve_file("@shipped/test/dice.json")
    data = json.loads(source.path.read_text(encoding="utf-8"))
    before_card, before_readme = generate.model_card(), generate.readme_block()
    data["summary"]["mean"] = 0.123456
    monkeypatch.setitem(results._JSON_CACHE, source.path, data)
    assert "0.123" in generate.model_card() and generate.model_card() != before_card
    calibration = results.resolve_file("@shipped/test/calibration.json")
    cal = json.loads(calibration.path.read_text(encoding="utf-8"))
    cal["pooled"]["clean"]["card"]["nll"] = 0.987654
    monkeypatch.setitem(results._JSON_CACHE, calibration.path, cal)
    assert "0.988" in generate.readme_block() and generate.readme_block() != before_readme


def test_the_readme_speed_table_follows_its_benchmark_files(monkeypatch):
    """The README's speed block reads the benchmarks' own result files: change the whole-case
    ratio or the Slicer commit and the block changes with it."""
    before = generate.readme_block("speed")
    case = results.resolve_file("Testing/benchmarks/results/whole_case.json")
    data = json.loads(case.path.read_text(encoding="utf-8"))
    data["case"]["ratio_median"]["card_over_uc"] = 9.876
    monkeypatch.setitem(results._JSON_CACHE, case.path, data)
    slicer = results.resolve_file("Testing/benchmarks/results/slicer_cine.json")
    cine = json.loads(slicer.path.read_text(encoding="utf-8"))
    cine["commit_replacing_every_frame_s"] = 7.654
    monkeypatch.setitem(results._JSON_CACHE, slicer.path, cine)
    after = generate.readme_block("speed")
    assert "9.88x" in after and after != before
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    begin, end = generate.markers("speed")
    assert readme.index(generate.END) < readme.index(begin) < readme.index(end)
    begin, end = generate.markers("slicer")  # the panel's figures sit in the Slicer section
    assert readme.index("## In Slicer") < readme.index(begin) < readme.index(end) < readme.index("## Results")
    assert "7.65" in generate.readme_block("slicer")


def test_references_resolve_through_a_release_chain(tmp_path, monkeypatch):
    """``@shipped`` is the release bundle.json names; a file it does not hold comes from the release
    its kept.json names; pointers, percentages, counts and booleans are rendered as the spec says."""
    res = tmp_path / "Training" / "results"
    (res / "acdc-9.1.0").mkdir(parents=True)
    (res / "acdc-9.0.0" / "test").mkdir(parents=True)
    (res / "acdc-9.1.0" / "kept.json").write_text(json.dumps({"from": "acdc-9.0.0"}))
    (res / "acdc-9.0.0" / "test" / "x.json").write_text(json.dumps({"a": {"b/c": [0.5, 0.25]}, "ok": True, "n": 7}))
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps({"id": {"name": "acdc", "version": "9.1.0"}}))
    releases = tmp_path / "releases.json"
    releases.write_text(json.dumps({"acdc-9.0.0": {"frozen_at": "abc1234"}}))
    monkeypatch.setattr(results, "REPO", tmp_path)
    monkeypatch.setattr(results, "RESULTS", res)
    monkeypatch.setattr(results, "SHIPPED_BUNDLE", bundle)
    monkeypatch.setattr(results, "RELEASES", releases)
    value, source = results.value_of("@shipped/test/x.json#/a/b~1c/1|%1")
    assert value == "25.0%" and source.release == "acdc-9.0.0"
    assert results.value_of("@acdc-9.0.0/test/x.json#a/b~1c|len")[0] == "2"
    assert results.value_of("@shipped/test/x.json#ok")[0] == "yes"
    assert results.value_of("@shipped/test/x.json#n|.2f")[0] == "7"
    assert "abc1234" in results.provenance(source) and "acdc-9.0.0/test/x.json" in results.provenance(source)
    assert results.fill_template("v{{ @shipped/test/x.json#a/b~1c/0|.2f }}.")[0] == "v0.50."
    for bad in ("@shipped/test/y.json#a", "@shipped/test/x.json#a/zz", "@shipped/test/x.json#a|.2f"):
        with pytest.raises(results.ResultError):
            results.value_of(bad)


def test_the_readme_is_short_and_shows_the_generated_table():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    block = readme.split(generate.BEGIN, 1)[1].split(generate.END, 1)[0]
    assert "|" in block and "Generated from the result files" in block
    # the two commands come first, before any install detail
    assert readme.index("bash Testing/run-demo.sh") < readme.index("## Install")
    assert readme.index("bash Testing/run-tests.sh") < readme.index("## Install")


def test_no_sentence_names_an_issue_number():
    texts = [REPO / "README.md", REPO / "CHANGELOG.md"] + _pages() + [DOCS / "_data" / "model_card.template.md"]
    bad = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in texts for m in ISSUE.finditer(p.read_text(encoding="utf-8"))]
    assert not bad, bad


def test_every_page_is_reachable_from_a_toctree():
    """The how-to and explanation pages are found by glob, the rest named: none is left out."""
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for page in _pages():
        rel = page.relative_to(DOCS).with_suffix("").as_posix()
        if rel in ("index", "README") or rel.startswith("_"):
            continue
        folder = rel.split("/")[0]
        assert rel in index or f"{folder}/*" in index, f"{rel} is in no toctree"


def test_the_speed_extra_pins_the_onnxruntime_that_constraints_pin():
    """The exported ONNX models' cache key holds the ONNX Runtime version: an environment made with
    ``.[speed]`` and one made under constraints.txt must agree, or each exports again."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11 reads pyproject.toml")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    speed = pyproject["project"]["optional-dependencies"]["speed"]
    pins = dict(
        ln.split("==") for ln in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines() if "==" in ln
    )
    assert f"onnxruntime=={pins['onnxruntime']}" in speed
    for tool in ("sphinx", "myst-parser", "furo", "sphinx-argparse"):
        assert tool in pins, f"{tool} is not pinned in constraints.txt"
