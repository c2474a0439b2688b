"""Peak memory of one ``cardseg segment`` process at the documented voxel limit.

    python Testing/benchmarks/peak_memory.py [--slices 16 --size 1024] [--threads 2] [--out FILE.json]

Writes a procedural phantom of ``slices x size x size`` voxels (16 x 1024 x 1024 is the limit of
the segmented volume, 16,777,216 voxels), then runs ``cardseg segment`` on it once per
configuration (backend x method) under ``/usr/bin/time -v`` and records the maximum resident set
size of the process. The ONNX models are exported (and cached) by a first run that is reported on
its own row, so the ``onnx`` rows measure a warm cache, as a user's second run. The README's
figures come from the JSON this writes (``Testing/benchmarks/results/peak_memory.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = (
    ("onnx-first-run", "onnx", "card"),
    ("torch", "torch", "card"),
    ("onnx", "onnx", "card"),
    ("torch-uc", "torch", "uc"),
)


def peak_kib(cmd, env) -> int:
    """Run ``cmd`` under ``/usr/bin/time -v``; its maximum resident set size in KiB."""
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"peak_memory: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    if not m:
        raise SystemExit("peak_memory: /usr/bin/time -v printed no maximum resident set size")
    return int(m.group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the figures here as JSON")
    a = ap.parse_args(argv)
    if not Path("/usr/bin/time").is_file():
        print("peak_memory: needs GNU time at /usr/bin/time (Debian: apt-get install time)", file=sys.stderr)
        return 2
    import SimpleITK as sitk

    from cardseg.bundle.phantom import synthetic_cine_volume

    work = Path(tempfile.mkdtemp(prefix="cardseg-peak-"))
    cache = work / "model-cache"  # a cache of its own: the first onnx run really exports
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "CARDSEG_CACHE_DIR": str(cache)}
    try:
        vol, _ = synthetic_cine_volume((a.slices, a.size, a.size), spacing=(0.35, 0.35, 8.0), seed=0)
        src = work / "limit.nii.gz"
        sitk.WriteImage(vol.to_image(), str(src))
        rows = []
        for name, backend, method in CONFIGS:
            out = work / f"out-{name}"
            kib = peak_kib(
                [
                    sys.executable,
                    "-m",
                    "cardseg",
                    "segment",
                    str(src),
                    "-o",
                    str(out),
                    "--backend",
                    backend,
                    "--method",
                    method,
                    "--threads",
                    str(a.threads),
                    "--progress",
                    "none",
                    "--quiet",
                ],
                env,
            )
            rows.append(
                {
                    "run": name,
                    "backend": backend,
                    "method": method,
                    "peak_rss_mib": round(kib / 1024, 1),
                    "peak_rss_gb": round(kib * 1024 / 1e9, 2),
                }
            )
            print(f"{name:16s} {kib / 1024:8.1f} MiB")
            shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "volume": [a.slices, a.size, a.size],
        "voxels": a.slices * a.size * a.size,
        "threads": a.threads,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "rows": rows,
    }
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
