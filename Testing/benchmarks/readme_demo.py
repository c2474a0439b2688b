"""Record what the README's first example prints (not a test, not timed).

    python Testing/benchmarks/readme_demo.py [--json Testing/benchmarks/results/readme_demo.json]

Runs the two commands of the README's quick start in a fresh temporary folder, exactly as a user
would (``cardseg synth demo.nii.gz`` then ``cardseg segment demo.nii.gz -o demo-out``, default
bundle, default backend), and keeps from ``demo-out/report.json`` what the README describes: the
class volumes, the agreement score and its out-of-domain flag, and the flagged regions (count and
each region's ``p_error``), with the files the run wrote. The numbers the README quotes for "what
you should see" stand in the JSON this writes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CARDSEG = [sys.executable, "-m", "cardseg"]


def run_demo(folder: Path, env: dict) -> dict:
    """The README's two commands in ``folder``; the parts of ``report.json`` the README names."""
    for cmd in (["synth", "demo.nii.gz"], ["segment", "demo.nii.gz", "-o", "demo-out", "--progress", "none"]):
        subprocess.run(CARDSEG + cmd, cwd=folder, env=env, check=True, capture_output=True, timeout=1200)
    report = json.loads((folder / "demo-out" / "report.json").read_text())
    regions = report.get("regions") or []
    return {
        "class_volumes_ml": report["class_volumes_ml"],
        "agreement": report["agreement"],
        "out_of_domain": report["out_of_domain"],
        "regions": len(regions),
        "regions_p_error": [r.get("p_error") for r in regions],
        "regions_p_error_above_0.8": sum(1 for r in regions if (r.get("p_error") or 0) > 0.8),
        "bundle": {k: v for k, v in (report.get("bundle") or {}).items() if k != "path"},
        "files": sorted(p.name for p in (folder / "demo-out").iterdir()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write the record here")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cardseg-demo-") as tmp:
        env = {**os.environ, "CARDSEG_CACHE_DIR": os.environ.get("CARDSEG_CACHE_DIR", str(Path(tmp) / "cache"))}
        work = Path(tmp) / "work"
        work.mkdir()
        record = {
            "commands": ["cardseg synth demo.nii.gz", "cardseg segment demo.nii.gz -o demo-out"],
            "date": time.strftime("%Y-%m-%d"),
            "python": platform.python_version(),
            **run_demo(work, env),
        }
    text = json.dumps(record, indent=2) + "\n"
    if a.json:
        a.json.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
