"""Benchmark: what it costs a fresh process to get the bundle's two networks ready (not a test).

    python Testing/benchmarks/network_loading.py [--bundle PATH] [--repeats 3] [--out FILE.json]

Each way is timed in its own fresh Python process (imports are per process), after ``import
torch`` (which every way pays and is timed on its own), least of ``--repeats``:

* ``eager``: import MONAI and the network code, build both networks, load the safetensors
  (what a run without prepared networks does);
* ``torchscript``: ``torch.jit.load`` of both cached programs (what the torch backend does
  after its first run, :mod:`cardseg.bundle.script_backend`);
* ``torch.export``: ``torch.export.load`` of both networks exported with ``torch.export`` and
  ``.module()`` (the alternative the issue suggested);
* ``onnx``: importing ONNX Runtime and opening both cached sessions (the CPU default).

The programs and models are made once, untimed, in a temporary cache. Writes the figures as
JSON (``Testing/benchmarks/results/network_loading.json``), which the README cites.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

PREPARE = r"""
import sys, warnings, torch
warnings.simplefilter("ignore")
from cardseg.bundle.loading import load_bundle
from cardseg.bundle.onnx_backend import probe_inputs
out, bundle = sys.argv[1], sys.argv[2] or None
load_bundle(bundle, backend="torch", prepared=True)       # TorchScript programs into the cache
load_bundle(bundle, backend="onnx")                       # ONNX models into the cache
b = load_bundle(bundle, backend="torch")
k, size = b.num_classes, int(b.config["input_size"])
dim = torch.export.Dim("batch", min=1, max=4096)
for role in ("primary", "reference"):
    ep = torch.export.export(getattr(b, role), probe_inputs(k, 1, size, batch=2),
                             dynamic_shapes=({0: dim}, {0: dim}, {0: dim}))
    torch.export.save(ep, f"{out}/{role}.pt2")
"""

TIMED = r"""
import sys, time, glob, warnings
warnings.simplefilter("ignore")
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
way, folder, bundle = sys.argv[1], sys.argv[2], sys.argv[3] or None
if way == "eager":
    from cardseg.bundle.loading import load_bundle
    load_bundle(bundle, backend="torch")
elif way == "torchscript":
    for f in sorted(glob.glob(f"{folder}/cache/models/*.pt")):
        torch.jit.load(f)
elif way == "torch.export":
    for role in ("primary", "reference"):
        torch.export.load(f"{folder}/{role}.pt2").module()
elif way == "onnx":
    import onnxruntime as ort
    for f in sorted(glob.glob(f"{folder}/cache/models/*.onnx")):
        ort.InferenceSession(f, providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, "monai" in sys.modules)
"""

WAYS = ("eager", "torchscript", "torch.export", "onnx")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default="")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write the figures here as JSON")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cardseg-loading-") as tmp:
        env = {**os.environ, "CARDSEG_CACHE_DIR": f"{tmp}/cache", "OMP_NUM_THREADS": str(a.threads)}
        subprocess.run([sys.executable, "-c", PREPARE, tmp, a.bundle], env=env, check=True)
        figures = {}
        for way in WAYS:
            runs = []
            for _ in range(a.repeats):
                p = subprocess.run(
                    [sys.executable, "-c", TIMED, way, tmp, a.bundle],
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                )
                torch_s, ready_s, monai = p.stdout.split()
                runs.append((float(torch_s), float(ready_s), monai == "True"))
            best = min(runs, key=lambda r: r[1])
            figures[way] = {
                "import_torch_s": min(r[0] for r in runs),
                "networks_ready_s": best[1],
                "monai_imported": best[2],
                "runs": runs,
            }
            print(
                f"{way:14s} networks ready {best[1]:.2f} s after torch (import torch {figures[way]['import_torch_s']:.2f} s)"
                f"{', MONAI imported' if best[2] else ''}"
            )
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "load_average_at_end": os.getloadavg(),
        },
        "bundle": a.bundle or "shipped default",
        "threads": a.threads,
        "repeats": a.repeats,
        "ways": figures,
    }
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
