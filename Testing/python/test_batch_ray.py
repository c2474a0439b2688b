"""`cardseg batch --ray` against the local run: a local Ray cluster of two CPUs started by the test,
the same cases, the same OUTDIR layout and table (timings aside), resumable the same way."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import SimpleITK as sitk

ray = pytest.importorskip("ray", reason="Ray not installed (the [cluster] extra)")

from cardseg.cohort.batch import run_batch  # noqa: E402
from cardseg.cohort.layout import COHORT_CSV  # noqa: E402
from cardseg.cohort.options import BatchOptions  # noqa: E402
from conftest import read_csv, without_timings  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bundle, synthetic_volume):
    vol, _ = synthetic_volume
    root = tmp_path_factory.mktemp("ray")
    for i in range(3):
        arr = np.roll(vol.array, 4 * i, axis=1) * (1.0 + 0.1 * i)
        sitk.WriteImage(vol.to_image(arr.astype(np.float32)), str(root / "in" / f"c{i}.nii.gz")) if (root / "in").mkdir(
            exist_ok=True
        ) is None else None
    (root / "in" / "c1b_broken.nii.gz").write_bytes(b"garbage")
    inputs = [str(root / "in")]
    common = dict(inputs=inputs, bundle=str(tiny_bundle), progress="none", threads=1, report=False)
    t0 = time.perf_counter()
    local = run_batch(BatchOptions(output=str(root / "local"), **common))
    t1 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        t2 = time.perf_counter()
        remote = run_batch(BatchOptions(output=str(root / "ray"), ray="auto", ray_workers=2, **common))
        tables = {d: read_csv(root / d / COHORT_CSV) for d in ("local", "ray")}
        t3 = time.perf_counter()
        # the finished cases again (not the broken one, which would be retried: a new actor)
        rerun = dict(common, inputs=[str(root / "in" / "c?.nii.gz")])
        again = run_batch(BatchOptions(output=str(root / "ray"), ray="auto", ray_workers=2, **rerun))
    finally:
        ray.shutdown()
    print(
        f"local {t1 - t0:.1f} s, ray.init {t2 - t1:.1f} s, ray batch {t3 - t2:.1f} s, rerun "
        f"{time.perf_counter() - t3:.1f} s"
    )
    return {"root": root, "local": local, "ray": remote, "again": again, "tables": tables}


def test_ray_table_equals_local(runs):
    local, remote = runs["tables"]["local"], runs["tables"]["ray"]
    assert [r["case"] for r in remote] == ["c0", "c1", "c1b_broken", "c2"]
    assert [r["status"] for r in remote] == ["ok", "ok", "error", "ok"]
    assert list(local[0]) == list(remote[0])  # same columns
    assert without_timings(remote) == without_timings(local)
    assert all(float(r["time_total_s"]) > 0 for r in remote if r["status"] == "ok")


def test_ray_outdir_layout_equals_local(runs):
    for case in ("c0", "c1", "c2"):
        a = sorted(p.name for p in (runs["root"] / "local" / case).iterdir())
        b = sorted(p.name for p in (runs["root"] / "ray" / case).iterdir())
        assert a == b and "report.json" in b
        ra = json.loads((runs["root"] / "local" / case / "report.json").read_text())
        rb = json.loads((runs["root"] / "ray" / case / "report.json").read_text())
        assert ra["agreement"] == rb["agreement"] and ra["class_volumes_ml"] == rb["class_volumes_ml"]
    top = lambda d: sorted(p.name for p in d.iterdir() if not p.is_dir())  # noqa: E731
    assert top(runs["root"] / "ray") == top(runs["root"] / "local")


def test_ray_loads_one_model_per_worker(runs):
    assert runs["ray"].computed == 3
    assert runs["ray"].worker_loads == 2  # two actors, each loaded the bundle once for its cases
    assert runs["local"].worker_loads == 1


def test_ray_resumes_like_local(runs):
    again = runs["again"]
    assert [r["case"] for r in again.rows] == ["c0", "c1", "c2"]
    assert again.computed == 0 and again.reused == 3 and again.worker_loads == 0  # no actor started
    assert [r["reused"] for r in again.rows] == [True, True, True]
    assert read_csv(runs["root"] / "ray" / COHORT_CSV)[0]["reused"] == "true"
