"""Option values that are numbers but no sensible request: refused in one line (exit 2) before
anything is read or written, and a Ray actor size that no node of the cluster can hold."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from cardseg.base.errors import CardsegError
from cardseg.base.options import MAX_THREADS
from cardseg.cohort import cluster
from cardseg.cohort.batch import run_batch
from cardseg.cohort.options import BatchOptions


def cardseg(*args):
    p = subprocess.run(
        [sys.executable, "-m", "cardseg", *[str(a) for a in args]], capture_output=True, text=True, timeout=300
    )
    return p.returncode, p.stderr.strip()


@pytest.mark.parametrize(
    "command, extra, message",
    [
        (
            "segment",
            ["--threads", str(MAX_THREADS + 1)],
            f"--threads must be 1 to {MAX_THREADS}, got {MAX_THREADS + 1}",
        ),
        ("batch", ["--threads", "100000"], f"--threads must be 1 to {MAX_THREADS}, got 100000"),
        (
            "batch",
            ["--ray", "local", "--ray-cpus-per-worker", "nan"],
            "--ray-cpus-per-worker must be a number above 0, got nan",
        ),
        (
            "batch",
            ["--ray", "local", "--ray-cpus-per-worker", "inf"],
            "--ray-cpus-per-worker must be a number above 0, got inf",
        ),
        (
            "batch",
            ["--ray", "local", "--ray-cpus-per-worker", "0"],
            "--ray-cpus-per-worker must be a number above 0, got 0.0",
        ),
        (
            "batch",
            ["--ray-workers", "2"],
            "--ray-workers is for a Ray cluster (--ray ADDRESS or --ray local); on this machine use --workers N",
        ),
    ],
)
def test_unreasonable_numbers_are_refused_before_any_work(
    tmp_path, tiny_bundle, rotated_nifti, command, extra, message
):
    out = tmp_path / "out"
    code, err = cardseg(command, rotated_nifti, "-o", out, "--bundle", tiny_bundle, *extra)
    assert code == 2 and err == f"cardseg: error: {message}"
    assert not out.exists()


def fake_ray(*cpus, dead=()):
    nodes = [{"Alive": True, "Resources": {"CPU": float(c)}} for c in cpus]
    nodes += [{"Alive": False, "Resources": {"CPU": float(c)}} for c in dead]
    return SimpleNamespace(nodes=lambda: nodes)


def test_an_actor_bigger_than_every_node_is_refused_here_and_warned_elsewhere(monkeypatch, capsys):
    monkeypatch.setattr(cluster, "ray", fake_ray(2, 4, dead=[64]))
    cluster.check_capacity(4, "local")  # fits the largest live node
    cluster.check_capacity(0.5, "auto")
    with pytest.raises(
        CardsegError,
        match=r"^--ray-cpus-per-worker 8: no node of the Ray cluster has that many "
        r"CPUs \(the largest has 4\)$",
    ):
        cluster.check_capacity(8, "local")  # a dead node's CPUs do not count
    assert capsys.readouterr().err == ""
    cluster.check_capacity(8, "ray://head:10001")  # an autoscaler may add such a node: a warning only
    err = capsys.readouterr().err
    assert err.startswith("cardseg: warning: --ray-cpus-per-worker 8: no node") and err.count("\n") == 1


def test_a_local_cluster_too_small_for_one_actor_writes_nothing(monkeypatch, tmp_path, tiny_bundle, rotated_nifti):
    """The batch stops before OUTDIR is made (it would wait for ever) and lets go of the cluster."""
    events = []
    monkeypatch.setattr(cluster, "ray", fake_ray(2))
    monkeypatch.setattr(cluster, "connect", lambda address: events.append(("connect", address)) or True)
    monkeypatch.setattr(cluster, "disconnect", lambda started: events.append(("disconnect", started)))
    out = tmp_path / "out"
    with pytest.raises(CardsegError, match="no node of the Ray cluster has that many CPUs"):
        run_batch(
            BatchOptions(
                inputs=[str(rotated_nifti)],
                output=str(out),
                bundle=str(tiny_bundle),
                ray="local",
                ray_cpus_per_worker=3,
                progress="none",
            )
        )
    assert events == [("connect", "local"), ("disconnect", True)]
    assert not out.exists()


def test_synth_into_a_folder_that_cannot_be_written_is_refused_in_one_line(tmp_path):
    """/proc stands for a read-only folder also when the tests run as root (who may write into a
    folder without write permission)."""
    code, err = cardseg("synth", "/proc/cardseg-synth.nii.gz")
    assert (
        code == 2
        and err.startswith("cardseg: error: /proc/cardseg-synth.nii.gz: cannot write there (/proc is not writable")
        and "\n" not in err
    )
    code, err = cardseg("synth", tmp_path / "ok.nii.gz", "--labels", "/proc/cardseg-labels.nii.gz")
    assert code == 2 and "cannot write there" in err and not (tmp_path / "ok.nii.gz").exists()


def test_an_existing_output_folder_that_cannot_be_written_is_refused(monkeypatch, tmp_path):
    """``segment -o`` into an existing (empty) folder: the results are made inside it, so that
    folder itself must be writable, not only its parent (before: 'Permission denied', exit 1)."""
    import tempfile

    from cardseg.io import outdir

    out = tmp_path / "readonly"
    out.mkdir()
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):  # what a read-only folder answers (also to root on a read-only mount)
        if dir is not None and os.path.samefile(dir, out):
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    with pytest.raises(CardsegError, match=rf"^{out}: cannot write there \({out} is not writable\)$"):
        outdir.check_output(out)
    assert outdir.check_output(tmp_path / "new") == tmp_path / "new"  # its parent is writable
    assert sorted(p.name for p in tmp_path.iterdir()) == ["readonly"]


def test_a_probe_file_left_behind_never_bars_a_result_folder(tmp_path):
    """A probe file is cardseg's own (a run killed between making and removing it): an earlier
    result folder holding one is still replaced with --overwrite, and a foreign folder is refused
    before anything is made in it."""
    from cardseg.base.files import PROBE_PREFIX
    from cardseg.io import outdir

    out = tmp_path / "result"
    with outdir.OutputWriter(out) as w:
        w.path("report.json").write_text("{}")
        w.commit()
    (out / f"{PROBE_PREFIX}abc123").write_bytes(b"")
    assert outdir.check_output(out, overwrite=True) == out
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"x")
    with pytest.raises(CardsegError, match="not written by cardseg"):
        outdir.check_output(foreign, overwrite=True)
    assert sorted(p.name for p in foreign.iterdir()) == ["holiday.jpg"]


def test_a_batch_folder_with_a_killed_runs_probe_is_resumed_and_the_probe_removed(tmp_path, tiny_bundle, rotated_nifti):
    """A run killed between making and removing its probe file leaves it in OUTDIR: the next run
    neither calls it a foreign file nor leaves it there once it is stale (a fresh one may be a live
    run's, it is only ignored)."""
    from cardseg.base.files import PROBE_PREFIX, PROBE_STALE_S

    out = tmp_path / "out"
    options = dict(inputs=[str(rotated_nifti)], output=str(out), bundle=str(tiny_bundle), progress="none", report=False)
    run_batch(BatchOptions(**options))
    stale, fresh = out / f"{PROBE_PREFIX}old", out / f"{PROBE_PREFIX}new"
    stale.write_bytes(b"")
    fresh.write_bytes(b"")
    os.utime(stale, (os.path.getmtime(stale) - 2 * PROBE_STALE_S,) * 2)
    result = run_batch(BatchOptions(**options, overwrite=True))  # writes a case again: its writer tidies OUTDIR
    assert result.computed == 1
    assert not stale.exists() and fresh.exists()
