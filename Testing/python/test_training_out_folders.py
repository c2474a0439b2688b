"""The training tools' --out folders: a file there, a file above, or a folder that cannot be
written is refused in one line (exit 2) before any work (it was 'File exists' / 'Not a
directory', exit 1, after the work)."""

from __future__ import annotations

import pytest

import cardseg.cli


@pytest.mark.parametrize(
    "command",
    [["evaluate", "--split", "val"], ["ablate", "--split", "val"], ["compare", "--card", "nowhere"], ["fit-review"]],
)
def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path, capsys, command):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for out, expected in (
        (afile, "exists and is not a folder"),
        (afile / "below", "is not a folder"),
        ("/proc/cardseg-out", "cannot write there"),
    ):
        assert cardseg.cli.main([*command, "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"cardseg: error: --out {out}: ") and expected in err and "\n" not in err
    assert afile.read_text() == "mine"


def test_check_out_folder_accepts_new_and_existing_folders(tmp_path):
    from cardseg_train.base.cli_options import check_out_folder

    check_out_folder(None)
    check_out_folder(str(tmp_path))
    check_out_folder(str(tmp_path / "new" / "deeper"))
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made (the probe is gone)
