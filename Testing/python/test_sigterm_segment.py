"""SIGTERM ends `cardseg segment` as Ctrl-C does: exit 143, one line, nothing half-written and no
temporary or lock left beside the output folder (issue 21, item 10)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

CARDSEG = [sys.executable, "-m", "cardseg"]


@pytest.mark.parametrize("existing", [False, True], ids=["new-outdir", "overwrite"])
def test_sigterm_mid_run_leaves_nothing_half_written(tmp_path, tiny_bundle, existing):
    src = tmp_path / "big.nii.gz"
    subprocess.run(CARDSEG + ["synth", str(src), "--slices", "48"], check=True, capture_output=True, timeout=120)
    out = tmp_path / "out"
    before = None
    if existing:  # an earlier result that a --overwrite run is replacing
        subprocess.run(
            CARDSEG
            + [
                "segment",
                str(src),
                "-o",
                str(out),
                "--bundle",
                str(tiny_bundle),
                "--method",
                "uc",
                "--progress",
                "none",
                "--backend",
                "torch",
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
        before = {p.name: p.read_bytes() for p in out.iterdir()}
    cmd = (
        CARDSEG
        + [
            "segment",
            str(src),
            "-o",
            str(out),
            "--bundle",
            str(tiny_bundle),
            "--progress",
            "json",
            "--backend",
            "torch",
            "--threads",
            "1",
        ]
        + (["--overwrite"] if existing else [])
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    seen = []
    deadline = time.time() + 240
    while time.time() < deadline:  # wait until the networks run, then stop it
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        try:
            stage = json.loads(line).get("stage")
        except ValueError:
            continue
        if stage == "trajectory":
            proc.send_signal(signal.SIGTERM)
            break
    rest_out, rest_err = proc.communicate(timeout=120)
    err = "".join(seen[-1:]) + rest_err
    assert proc.returncode == 143, (proc.returncode, err[-2000:])
    assert "terminated" in err and "Traceback" not in err
    leftovers = [p.name for p in tmp_path.iterdir() if "cardseg" in p.name]
    assert leftovers == [], leftovers
    if existing:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old result untouched
    else:
        assert not out.exists()
