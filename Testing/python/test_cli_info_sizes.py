"""``cardseg sizes`` prints one aligned table; ``cardseg info --bundle ""`` is refused, not read as
the default bundle."""

from __future__ import annotations

import subprocess
import sys

from cardseg.method.networks import SWIN_SIZES, UNET_SIZES, build_network, count_parameters


def test_sizes_is_one_aligned_table_of_every_network(capsys):
    from cardseg.cli import main

    assert main(["sizes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, rows, footer = lines[0], lines[1:-1], lines[-1]
    assert header.split() == ["network", "parameters"] and footer.startswith("(")
    assert len(rows) == len(SWIN_SIZES) + len(UNET_SIZES)
    assert {len(line) for line in [header, *rows]} == {len(header)}  # the numbers end in one column
    name_end = header.index("parameters") - 1
    for line in rows:  # each name fits before the number column (one space at least)
        assert line[:name_end].rstrip() and line[len(line.rstrip().rsplit(" ", 1)[0]) :].strip()
    micro = next(line for line in rows if line.startswith("time-unet:micro"))
    n = count_parameters(build_network({"arch": "time-unet", "size": "micro", "num_classes": 4}))
    assert micro.split()[-1] == f"{n:,d}"


def test_an_empty_bundle_path_is_refused_not_taken_for_the_default():
    r = subprocess.run(
        [sys.executable, "-m", "cardseg", "info", "--bundle", ""], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == "cardseg: error: the bundle path is empty (leave --bundle out for the default bundle)"
