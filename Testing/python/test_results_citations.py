"""Every number RESULTS.md cites from a committed result file stands in that file.

A citation is a number (optionally with %, meaning the field is a fraction shown x 100) followed
by `` (`FILE#PATH`) ``: FILE relative to the RESULTS.md, PATH a ``/``-separated walk through the
JSON where ``[key=value]`` picks the list element whose ``key`` equals ``value``. The cited
number must equal the field rounded to the number of decimals the text shows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "Training" / "results").glob("*/RESULTS.md"))
CITATION = re.compile(r"(-?\d+(?:\.\d+)?)(%?)x?\s+\(`([\w./-]+\.json)#([^`]+)`\)")


def resolve(data, path: str):
    """Walk ``data`` along ``a/b/[key=value]/c``."""
    for part in path.split("/"):
        m = re.fullmatch(r"\[(\w+)=(.+)\]", part)
        if m:
            key, value = m.groups()
            hits = [x for x in data if str(x.get(key)) == value]
            if len(hits) != 1:
                raise KeyError(f"{len(hits)} elements with {key}={value!r}")
            data = hits[0]
        elif isinstance(data, list):
            data = data[int(part)]
        else:
            data = data[part]
    return data


def citations(text: str):
    for m in CITATION.finditer(text):
        number, percent, file, path = m.groups()
        yield number, bool(percent), file, path


def test_the_citation_reader_catches_a_wrong_number(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"rows": [{"label": "A b", "v": 0.2784}], "x": {"y": 0.5}}))
    good = "CARD 0.278 (`r.json#rows/[label=A b]/v`), 27.8% (`r.json#rows/[label=A b]/v`) and 0.50 (`r.json#x/y`)"
    found = list(citations(good))
    assert len(found) == 3
    assert _mismatches(found, tmp_path) == []
    assert len(_mismatches(list(citations("0.279 (`r.json#rows/[label=A b]/v`)")), tmp_path)) == 1


def _mismatches(found, base: Path):
    bad, cache = [], {}
    for number, percent, file, path in found:
        if file not in cache:
            cache[file] = json.loads((base / file).read_text())
        value = float(resolve(cache[file], path)) * (100 if percent else 1)
        decimals = len(number.split(".")[1]) if "." in number else 0
        if round(value, decimals) != float(number) and f"{value:.{decimals}f}" != number:
            bad.append(f"{number}{'%' if percent else ''} cites {file}#{path} = {value}")
    return bad


@pytest.mark.parametrize("results", RESULTS, ids=lambda p: p.parent.name)
def test_cited_numbers_match_their_files(results):
    found = list(citations(results.read_text(encoding="utf-8")))
    if results.parent.name == "acdc-2.1.0":
        assert len(found) >= 15  # the "what reproduces" list is there and read
    assert _mismatches(found, results.parent) == []
