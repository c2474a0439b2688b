"""JSON nested far deeper than anything the program writes (``[`` x 100,000) in the files it
reads back: a bundle's ``bundle.json``, an output folder's stamp, a batch's stamp and state. Each
is refused in one line or read as absent, never a traceback."""

from __future__ import annotations

import pytest

from cardseg.base import strictjson
from cardseg.base.errors import CardsegError

DEEP = "[" * 100_000 + "]" * 100_000


def test_the_bounded_reader_refuses_deep_nesting_and_reads_the_rest():
    with pytest.raises(ValueError, match="nested more than"):
        strictjson.bounded_loads(DEEP)
    text = '{"a": [1, {"b": "[[[[ not brackets"}], "c": NaN}'
    got = strictjson.bounded_loads(text)
    assert got["a"][1]["b"].startswith("[[[[") and got["c"] != got["c"]  # NaN read as json reads it
    assert strictjson.nesting_depth(text) == 3


def test_a_request_line_nested_deeply_is_a_value_error():
    with pytest.raises(ValueError, match="nested more than"):
        strictjson.loads('{"id": ' + DEEP + "}")


def test_a_deep_bundle_json_is_refused_in_one_line(tmp_path):
    from cardseg.bundle.folder import read_config

    (tmp_path / "bundle.json").write_text(DEEP)
    with pytest.raises(CardsegError, match="unreadable bundle.json") as info:
        read_config(tmp_path)
    assert "\n" not in str(info.value)


def test_a_deep_output_stamp_is_no_stamp(tmp_path):
    from cardseg.io.outdir import STAMP, check_output, read_stamp

    out = tmp_path / "res"
    out.mkdir()
    (out / STAMP).write_text(DEEP)
    (out / "report.json").write_text("{}")
    assert read_stamp(out) is None
    with pytest.raises(CardsegError):  # a folder cardseg cannot prove it wrote: never replaced
        check_output(out, overwrite=True)
    assert (out / "report.json").read_text() == "{}"


def test_a_deep_batch_stamp_and_state_are_read_as_absent(tmp_path):
    from cardseg.cohort.layout import BATCH_STAMP, STATE_FILE
    from cardseg.cohort.state import read_batch_stamp, read_state

    (tmp_path / BATCH_STAMP).write_text(DEEP)
    (tmp_path / STATE_FILE).write_text(DEEP + "\n" + '{"case": "p1", "status": "done"}\n')
    assert read_batch_stamp(tmp_path) is None
    assert list(read_state(tmp_path)) == ["p1"]


def test_a_deep_cache_record_is_a_miss(tmp_path):
    from cardseg.bundle.onnx_cache import read_recorded

    model, record = tmp_path / "m.onnx", tmp_path / "m.json"
    model.write_bytes(b"model bytes")
    record.write_text(DEEP)
    assert read_recorded(model, record, "key", "sha256") is None  # exported again, the record rewritten
