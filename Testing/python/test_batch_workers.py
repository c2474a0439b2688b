"""`cardseg batch --workers N` (cardseg.cohort.local_pool): the same table and case folders as one worker,
one bundle load per worker process, a worker that dies fails only the cases it was running, and
the options are checked before anything is written."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.cohort.batch import run_batch
from cardseg.cohort.layout import COHORT_CSV, LOCK_FILE, SEGMENT_LEFTOVER
from cardseg.cohort.options import BatchOptions, WorkerOptions, check_options
from cardseg.cohort.worker import Job
from cardseg.cohort import local_pool
from cardseg.base.errors import CardsegError
from conftest import read_csv, without_timings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, synthetic_volume):
    vol, _ = synthetic_volume
    root = tmp_path_factory.mktemp("workers") / "in"
    root.mkdir()
    for i in range(4):
        arr = np.roll(vol.array, 3 * i, axis=2) * (1.0 + 0.05 * i)
        sitk.WriteImage(vol.to_image(arr.astype(np.float32)), str(root / f"c{i}.nii.gz"))
    (root / "c1b_broken.nii.gz").write_bytes(b"garbage")
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bundle, inputs):
    root = tmp_path_factory.mktemp("runs")
    common = dict(inputs=[str(inputs)], bundle=str(tiny_bundle), progress="none", threads=1, report=False)
    one = run_batch(BatchOptions(output=str(root / "one"), **common))
    two = run_batch(BatchOptions(output=str(root / "two"), workers=2, **common))
    return {"root": root, "one": one, "two": two}


def test_table_and_folders_equal_one_worker(runs):
    one, two = (read_csv(runs["root"] / d / COHORT_CSV) for d in ("one", "two"))
    assert [r["case"] for r in two] == ["c0", "c1", "c1b_broken", "c2", "c3"]
    assert [r["status"] for r in two] == ["ok", "ok", "error", "ok", "ok"]
    assert without_timings(two) == without_timings(one)
    for case in ("c0", "c1", "c2", "c3"):
        a, b = (runs["root"] / d / case for d in ("one", "two"))
        assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
        ra, rb = (json.loads((d / "report.json").read_text()) for d in (a, b))
        assert ra["agreement"] == rb["agreement"] and ra["class_volumes_ml"] == rb["class_volumes_ml"]


def test_one_bundle_load_per_worker_process(runs):
    assert runs["two"].computed == 4 and runs["two"].failed == 1
    assert runs["two"].worker_loads == 2 and runs["one"].worker_loads == 1


def test_rerun_reuses_the_cases_without_starting_workers(runs, tiny_bundle, inputs):
    again = run_batch(
        BatchOptions(
            inputs=[str(inputs / "c?.nii.gz")],
            output=str(runs["root"] / "two"),
            bundle=str(tiny_bundle),
            progress="none",
            threads=1,
            report=False,
            workers=2,
        )
    )
    assert again.computed == 0 and again.reused == 4 and again.worker_loads == 0


def test_a_dying_worker_fails_only_its_cases(tmp_path, tiny_bundle, inputs):
    """A worker process killed in the middle of the batch: the case(s) it was running get a one-line
    error, every other case finishes on a fresh set of workers."""
    from cardseg.bundle.folder import check_bundle_folder

    root, _ = check_bundle_folder(str(tiny_bundle))
    jobs = [Job(case=f"c{i}", path=str(inputs / f"c{i}.nii.gz"), out=str(tmp_path / f"c{i}")) for i in range(4)]
    results = []

    def on_result(res):
        results.append(res)
        if len(results) == 1:  # kill a worker that is busy with another case
            victim = multiprocessing.active_children()[0]
            os.kill(victim.pid, signal.SIGKILL)

    local_pool.run_jobs(jobs, on_result, bundle_root=root, options=WorkerOptions(threads=1), workers=2)
    by_case = {r["case"]: r for r in results}
    assert sorted(by_case) == ["c0", "c1", "c2", "c3"] and len(results) == 4
    died = [r for r in results if r["status"] == "error"]
    assert 1 <= len(died) <= 2  # what was in flight when the pool broke
    assert all(r["error"].startswith("worker process died") and "\n" not in r["error"] for r in died)
    assert all((tmp_path / r["case"] / "report.json").is_file() for r in results if r["status"] == "ok")
    assert sum(r["status"] == "ok" for r in results) >= 2


@pytest.mark.parametrize(
    "sig, group, code", [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143), (signal.SIGTERM, True, 143)]
)
def test_an_interrupt_while_cases_are_written_leaves_nothing_half_written(
    tmp_path, tiny_bundle, inputs, sig, group, code
):
    """Ctrl-C to the process group, or SIGTERM to the batch process alone, while the workers write
    cases: each worker's case cleans up (no temporary folder, no lock) and the exit status is 130 or 143."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cardseg",
            "batch",
            str(inputs),
            "-o",
            str(out),
            "--bundle",
            str(tiny_bundle),
            "--workers",
            "2",
            "--threads",
            "1",
            "--progress",
            "none",
        ],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even under `nohup`
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 240
        while (
            time.time() < deadline
            and proc.poll() is None
            and not (out.is_dir() and any(n.endswith(".cardseg-tmp") for n in os.listdir(out)))
        ):
            time.sleep(0.01)
        assert proc.poll() is None, "the batch ended before the test could stop it: " + proc.stderr.read()
        (os.killpg if group else os.kill)(proc.pid, sig)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code and "Traceback" not in stderr, stderr
    assert [p.name for p in out.iterdir() if SEGMENT_LEFTOVER.match(p.name) or p.name == LOCK_FILE] == []
    assert "pending" in {r["status"] for r in read_csv(out / COHORT_CSV)}


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--workers", "0"], "--workers must be at least 1, got 0"),
        (["--workers", "2", "--ray", "local"], "--workers is for this machine; with --ray use --ray-workers"),
    ],
)
def test_worker_options_are_refused_in_one_line(tmp_path, tiny_bundle, inputs, extra, message):
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "cardseg", "batch", str(inputs), "-o", str(out), "--bundle", str(tiny_bundle), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and p.stderr.strip() == f"cardseg: error: {message}"
    assert not out.exists()


def test_python_dash_m_cardseg_runs_workers(tmp_path, tiny_bundle, inputs):
    """``python -m cardseg batch --workers 2``: the spawned workers import cardseg.__main__ without
    running the command again."""
    out = tmp_path / "out"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "cardseg",
            "batch",
            str(inputs / "c?.nii.gz"),
            "-o",
            str(out),
            "--bundle",
            str(tiny_bundle),
            "--workers",
            "2",
            "--threads",
            "1",
            "--quiet",
            "--no-report",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    assert [r["status"] for r in read_csv(out / COHORT_CSV)] == ["ok"] * 4


def test_threads_are_shared_out():
    from cardseg.base.cpus import usable_cpus

    assert local_pool.default_threads(1) == usable_cpus()  # affinity and cgroup quota, not os.cpu_count()
    assert local_pool.default_threads(10 * usable_cpus()) == 1
    with pytest.raises(CardsegError):
        check_options(BatchOptions(inputs=["x"], workers=-1))


class SlowToStop:
    """A worker process that stops ``after`` seconds after it is told to (its case cleaning up)."""

    def __init__(self, after: float):
        import time

        self.after, self.stop_at, self.killed, self.clock = after, None, False, time.monotonic

    def terminate(self):
        self.stop_at = self.clock() + self.after

    def is_alive(self):
        return not self.killed and (self.stop_at is None or self.clock() < self.stop_at)

    def join(self, timeout=None):
        import time

        if self.is_alive():
            time.sleep(max(0.0, min(timeout if timeout is not None else 1e9, self.stop_at - self.clock())))

    def kill(self):
        self.killed = True


class FakePool:
    def __init__(self, procs):
        self._processes = dict(enumerate(procs))

    def shutdown(self, wait=True, cancel_futures=False):
        pass


@pytest.mark.parametrize("after, said_waiting, killed", [(0.05, False, False), (0.6, True, False), (5.0, True, True)])
def test_a_stop_says_when_it_waits_for_the_workers_and_kills_them_after_the_grace(
    monkeypatch, capsys, after, said_waiting, killed
):
    from cardseg.cohort import local_pool

    monkeypatch.setattr(local_pool, "STOP_NOTICE_S", 0.3)
    procs = [SlowToStop(after), SlowToStop(0.0)]
    local_pool._stop(FakePool(procs), grace_s=1.0)
    err = capsys.readouterr().err
    assert ("waiting up to 1 s for the workers to clean up their cases" in err) == said_waiting
    assert ("did not stop in time and was killed" in err) == killed
    assert procs[0].killed == killed and not any(p.is_alive() for p in procs)
