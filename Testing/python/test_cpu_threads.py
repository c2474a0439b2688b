"""Default thread counts come from the CPUs this process may use (affinity mask, cgroup v2 CPU
quota), never from the machine's core count; and an ``auto`` run without the [speed] extra says
in one note line how to get the fast backend."""

from __future__ import annotations

import os

import pytest
import torch

from cardseg.base import cpus
from cardseg.cli import main


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A fake 64-core host: ``set(affinity, cpu_max)`` fixes the affinity mask size and the cgroup
    file's text (None: no file)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(cpus, "CGROUP_CPU_MAX", str(quota))

    def set_(affinity: int, cpu_max):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
        if cpu_max is None:
            if quota.exists():
                quota.unlink()
        else:
            quota.write_text(cpu_max)

    return set_


@pytest.mark.parametrize(
    "affinity,cpu_max,expected",
    [
        (8, None, 8),  # pinned to 8 of 64 cores, no quota
        (64, "max 100000\n", 64),  # no quota
        (64, "200000 100000\n", 2),  # a container of 2 CPUs on a 64-core host
        (64, "150000 100000\n", 2),  # 1.5 CPUs: rounded up
        (64, "50000 100000\n", 1),  # half a CPU: still one thread
        (2, "800000 100000\n", 2),  # the affinity mask is the smaller
        (1, None, 1),
        (16, "garbage\n", 16),  # malformed: ignored
        (16, "0 100000\n", 16),
        (16, "-1 100000\n", 16),
        (16, "100000 0\n", 16),
        (16, "nan 100000\n", 16),
        (16, "", 16),
    ],
)
def test_usable_cpus_follow_affinity_and_quota_not_cpu_count(machine, affinity, cpu_max, expected):
    machine(affinity, cpu_max)
    assert cpus.usable_cpus() == expected


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 100])
def test_default_threads_share_the_usable_cpus(machine, workers):
    machine(64, "400000 100000\n")
    assert cpus.default_threads(workers) == max(1, 4 // workers)


def test_batch_pool_uses_the_same_share(machine):
    from cardseg.cohort.local_pool import default_threads

    machine(64, "300000 100000\n")
    assert default_threads(1) == 3 and default_threads(2) == 1


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _segment(tiny_bundle, synthetic_volume, tmp_path, *extra):
    vol, _ = synthetic_volume
    import SimpleITK as sitk

    src = tmp_path / "in.nii.gz"
    sitk.WriteImage(vol.to_image(), str(src))
    return main(
        [
            "segment",
            str(src),
            "-o",
            str(tmp_path / "out"),
            "--bundle",
            str(tiny_bundle),
            "--device",
            "cpu",
            "--progress",
            "none",
            *extra,
        ]
    )


@pytest.mark.parametrize("given,expected", [(None, 3), ("1", 1)])
def test_segment_sets_torch_threads_from_the_usable_cpus(
    machine, restore_threads, tiny_bundle, synthetic_volume, tmp_path, given, expected
):
    machine(64, "300000 100000\n")
    torch.set_num_threads(7)
    extra = ["--backend", "torch"] + (["--threads", given] if given else [])
    assert _segment(tiny_bundle, synthetic_volume, tmp_path, *extra) == 0
    assert torch.get_num_threads() == expected


@pytest.mark.parametrize("backend,quiet,notes", [("auto", False, 1), ("auto", True, 0), ("torch", False, 0)])
def test_auto_without_the_speed_extra_says_how_to_get_it(
    monkeypatch, restore_threads, tiny_bundle, synthetic_volume, tmp_path, capsys, backend, quiet, notes
):
    import cardseg.bundle.onnx_backend as ob

    monkeypatch.setattr(ob, "available", lambda: "--backend onnx needs onnxruntime (pip install 'cardsegment[speed]')")
    extra = ["--backend", backend] + (["--quiet"] if quiet else [])
    assert _segment(tiny_bundle, synthetic_volume, tmp_path, *extra) == 0
    err = capsys.readouterr().err.splitlines()
    found = [ln for ln in err if ln.startswith("cardseg: note:")]
    assert len(found) == notes, err
    if notes:
        assert "cardsegment[speed]" in found[0]
    assert len(err) == notes, err  # nothing else on stderr
