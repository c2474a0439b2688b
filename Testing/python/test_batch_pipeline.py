"""The overlapped case pipeline of ``cardseg batch`` (``cardseg.cohort.pipeline``): the same outputs
and order as case after case, a bad case in the middle, reading and writing really overlapping
the computation, and an interrupt that leaves only complete outputs behind."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.cohort import pipeline
from cardseg.cohort.worker import CaseWorker, Job

OUTPUTS = ("segmentation.nii.gz", "probabilities.nii.gz", "disagreement.nii.gz", "temperature.nii.gz", "regions.nii.gz")


def _cases(tmp_path: Path, vol, n: int, bad: int = -1) -> list:
    jobs = []
    for i in range(n):
        src = tmp_path / "in" / f"case{i}.nii.gz"
        src.parent.mkdir(parents=True, exist_ok=True)
        if i == bad:
            src.write_bytes(b"not an image")
        else:
            arr = np.roll(vol.array, 3 * i, axis=2).astype(np.float32)
            sitk.WriteImage(vol.to_image(arr), str(src))
        jobs.append(Job(case=f"case{i}", path=str(src), out=str(tmp_path / "out" / f"case{i}")))
    return jobs


@pytest.fixture()
def worker(tiny_bundle):
    w = CaseWorker(tiny_bundle, device="cpu", backend="torch")
    w.load()
    return w


def test_same_outputs_and_order_as_case_after_case_with_a_bad_case_in_the_middle(worker, synthetic_volume, tmp_path):
    vol, _ = synthetic_volume
    jobs = _cases(tmp_path / "a", vol, 4, bad=1)
    seen = []
    pipeline.run_overlapped(worker, jobs, seen.append)
    assert [r["case"] for r in seen] == ["case0", "case1", "case2", "case3"]
    assert [r["status"] for r in seen] == ["ok", "error", "ok", "ok"]
    assert "case1.nii.gz" in seen[1]["error"] and "\n" not in seen[1]["error"]
    assert not Path(jobs[1].out).exists()
    for job in (j for k, j in enumerate(jobs) if k != 1):
        one = worker.run(Job(case=job.case, path=job.path, out=job.out + "-alone"))
        assert one["status"] == "ok"
        for name in OUTPUTS:
            a = sitk.GetArrayFromImage(sitk.ReadImage(str(Path(job.out) / name)))
            b = sitk.GetArrayFromImage(sitk.ReadImage(str(Path(job.out + "-alone") / name)))
            np.testing.assert_array_equal(a, b, err_msg=f"{job.case} {name}")
    leftovers = [p.name for p in (tmp_path / "a" / "out").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def _counting(real, on_call):
    """``real`` (:func:`cardseg.segment.run_networks`) called after ``on_call(i)``, i the case's
    index: the main thread runs the networks case after case, in the order of the jobs."""
    calls = []

    def run_networks(*args, **kw):
        calls.append(None)
        on_call(len(calls) - 1)
        return real(*args, **kw)

    return run_networks


def _signalling(real, n: int, done: threading.Event):
    """``real`` (:func:`cardseg.segment.run_networks`), setting ``done`` once ``n`` cases have been computed."""
    calls = []

    def run_networks(*args, **kw):
        out = real(*args, **kw)
        calls.append(None)
        if len(calls) == n:
            done.set()
        return out

    return run_networks


def test_the_next_case_is_read_and_the_last_written_while_one_computes(worker, synthetic_volume, tmp_path, monkeypatch):
    """While case 1 computes, case 2 is being read and case 0 written (events, not timings)."""
    from cardseg import segment

    vol, _ = synthetic_volume
    jobs = _cases(tmp_path, vol, 3)
    read_started = {i: threading.Event() for i in range(3)}
    write_started = {i: threading.Event() for i in range(3)}
    during_compute = {}
    real_read, real_write = segment.read_case, segment.write_outputs

    def read_case(path, out, **kw):
        read_started[int(Path(path).name[4])].set()
        return real_read(path, out, **kw)

    def waits(i):
        if i == 1:  # wait (bounded) for the neighbours' work to start: it must not need this case to end
            during_compute["read 2"] = read_started[2].wait(60)
            during_compute["write 0"] = write_started[0].wait(60)

    def write_outputs(result, volume, bundle, out, *a, **kw):
        write_started[int(Path(out).name[4])].set()
        return real_write(result, volume, bundle, out, *a, **kw)

    monkeypatch.setattr(segment, "read_case", read_case)
    monkeypatch.setattr(segment, "run_networks", _counting(segment.run_networks, waits))
    monkeypatch.setattr(segment, "write_outputs", write_outputs)
    seen = []
    pipeline.run_overlapped(worker, jobs, seen.append, finishers=1)
    assert during_compute == {"read 2": True, "write 0": True}
    assert [r["status"] for r in seen] == ["ok"] * 3


def test_several_finishers_finish_cases_at_once_and_report_them_in_order(
    worker, synthetic_volume, tmp_path, monkeypatch
):
    """With 3 finishing threads, cases 0, 1 and 2 are finished at the same time (each waits for
    the others to start), the networks go on meanwhile, and the results still come in order; the
    outputs equal a lone run's."""
    from cardseg import segment

    vol, _ = synthetic_volume
    jobs = _cases(tmp_path, vol, 5)
    started = {i: threading.Event() for i in range(5)}
    met = {}
    real_finish = segment.finish_case

    def finish_case(run, volume, bundle, path, **kw):
        i = int(Path(path).name[4])
        started[i].set()
        if i < 3:
            met[i] = all(started[j].wait(60) for j in range(3))
        return real_finish(run, volume, bundle, path, **kw)

    monkeypatch.setattr(segment, "finish_case", finish_case)
    seen = []
    pipeline.run_overlapped(worker, jobs, seen.append, finishers=3)
    assert met == {0: True, 1: True, 2: True}
    assert [(r["case"], r["status"]) for r in seen] == [(f"case{i}", "ok") for i in range(5)]
    one = worker.run(Job(case="alone", path=jobs[2].path, out=jobs[2].out + "-alone"))
    assert one["status"] == "ok"
    for name in OUTPUTS:
        a = sitk.GetArrayFromImage(sitk.ReadImage(str(Path(jobs[2].out) / name)))
        b = sitk.GetArrayFromImage(sitk.ReadImage(str(Path(jobs[2].out + "-alone") / name)))
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_default_finishers_grow_with_the_cpus():
    assert [pipeline.default_finishers(c) for c in (1, 2, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 4]


@pytest.mark.parametrize("finishers", [1, 3])
def test_an_interrupt_reports_the_finished_case_and_leaves_no_partial_output(
    worker, synthetic_volume, tmp_path, monkeypatch, finishers
):
    from cardseg import segment

    vol, _ = synthetic_volume
    jobs = _cases(tmp_path, vol, 3)

    def interrupt(i):
        if i == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(segment, "run_networks", _counting(segment.run_networks, interrupt))
    seen = []
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_overlapped(worker, jobs, seen.append, finishers=finishers)
    assert [(r["case"], r["status"]) for r in seen] == [("case0", "ok")]
    assert (Path(jobs[0].out) / "report.json").is_file()
    assert not Path(jobs[1].out).exists() and not Path(jobs[2].out).exists()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["case0"]


def test_an_interrupt_while_waiting_for_a_finisher_loses_no_case_and_leaves_no_writer_open(
    worker, synthetic_volume, tmp_path, monkeypatch, request
):
    """Ctrl-C lands while the main thread waits for case 0's finishing (case 1 computed and handed
    over): both are finished and reported, in order, nothing of case 2 is made, and no temporary
    folder or lock is left in the output folder."""
    import os
    import signal
    import sys

    from cardseg import segment

    vol, _ = synthetic_volume
    jobs = _cases(tmp_path, vol, 3)
    computed_1 = threading.Event()
    run_networks = _signalling(segment.run_networks, 2, computed_1)
    real_finish = segment.finish_case

    def main_thread_waits() -> bool:
        """Whether the main thread sits in a wait for a result (a future's condition)."""
        frame = sys._current_frames().get(threading.main_thread().ident)
        return frame is not None and frame.f_code.co_name == "wait"

    def finish_case(run, volume, bundle, path, **kw):
        if Path(path).name.startswith("case0"):
            assert computed_1.wait(60)
            deadline = time.monotonic() + 60  # the main thread has handed case 1 over and waits for this one
            while not main_thread_waits() and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGINT)
        return real_finish(run, volume, bundle, path, **kw)

    # Ctrl-C as a terminal delivers it, also where the test runner itself was started with SIGINT
    # ignored (a background job of a script)
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, old_handler))
    monkeypatch.setattr(segment, "run_networks", run_networks)
    monkeypatch.setattr(segment, "finish_case", finish_case)
    seen = []
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_overlapped(worker, jobs, seen.append, finishers=1)
    assert [(r["case"], r["status"]) for r in seen] == [("case0", "ok"), ("case1", "ok")]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["case0", "case1"]
    for job in jobs[:2]:
        assert (Path(job.out) / "report.json").is_file()


def test_interrupts_inside_on_result_still_report_the_cases_finished_behind(
    worker, synthetic_volume, tmp_path, monkeypatch
):
    """Ctrl-C lands while case 0 is being reported, and again while case 1 is, with cases 1 and 2
    finished behind: every case is still reported (none is dropped from the queue unreported),
    then the interrupt goes on."""
    from cardseg import segment

    vol, _ = synthetic_volume
    jobs = _cases(tmp_path, vol, 3)
    all_computed = threading.Event()
    run_networks = _signalling(segment.run_networks, 3, all_computed)
    real_finish = segment.finish_case

    def finish_case(run, volume, bundle, path, **kw):
        if Path(path).name.startswith("case0"):
            assert all_computed.wait(60)  # so that cases 1 and 2 are behind it when it is reported
        return real_finish(run, volume, bundle, path, **kw)

    seen = []

    def on_result(r):
        seen.append(r["case"])
        if len(seen) <= 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(segment, "run_networks", run_networks)
    monkeypatch.setattr(segment, "finish_case", finish_case)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_overlapped(worker, jobs, on_result, finishers=3)
    assert seen == ["case0", "case1", "case2"]


def test_a_failed_write_is_that_case_error_and_the_batch_goes_on(worker, synthetic_volume, tmp_path, monkeypatch):
    from cardseg import segment

    vol, _ = synthetic_volume
    jobs = _cases(tmp_path, vol, 3)
    real_write = segment.write_outputs

    def write_outputs(result, volume, bundle, out, *a, **kw):
        if Path(out).name == "case0":
            raise OSError(28, "No space left on device")
        return real_write(result, volume, bundle, out, *a, **kw)

    monkeypatch.setattr(segment, "write_outputs", write_outputs)
    for finishers in (1, 2):
        seen = []
        pipeline.run_overlapped(worker, jobs, seen.append, finishers=finishers)
        assert [r["status"] for r in seen] == ["error", "ok", "ok"]
        for job in jobs[1:]:
            job.overwrite = True  # the second round replaces the first's results
    assert "No space left" in seen[0]["error"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["case1", "case2"]


def test_stderr_redirections_of_the_reader_and_the_writer_never_interleave(monkeypatch):
    """The reader mutes fd 2 (damaged image files) while the writer catches it (short writes): two
    overlapping redirections would restore each other's saved descriptor in the wrong order and
    leave the process's stderr on /dev/null (a batch stopped by SIGTERM then printed nothing)."""
    import os

    from cardseg.io.inputs import _native_stderr_muted
    from cardseg.io.written import muted_native_stderr

    before = os.readlink("/proc/self/fd/2") if os.path.exists("/proc/self/fd/2") else None
    if before is None:
        pytest.skip("needs /proc")
    import sys

    monkeypatch.setattr(sys, "stderr", sys.__stderr__)  # a real fd 2 behind sys.stderr, as in a cardseg process
    reader_in, reader_out = threading.Event(), threading.Event()

    def reader():
        with _native_stderr_muted():
            reader_in.set()
            threading.Event().wait(0.3)  # the writer tries to redirect meanwhile
        reader_out.set()

    def writer():
        reader_in.wait(10)
        with muted_native_stderr():
            reader_out.wait(10)  # without one lock: still inside when the reader restores fd 2

    threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert os.readlink("/proc/self/fd/2") == before


def test_progress_lines_stay_whole_and_in_order_while_other_threads_catch_fd2():
    """Write threads catch fd 2 around SimpleITK (and print what they caught again) while the main
    thread reports JSON progress, which the Slicer module reads one object per line: every line on
    the process's stderr stays one whole JSON object or one caught line, and the progress counts
    come in order (a progress line written during a capture would come out later, or cut into)."""
    import json
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os, threading, time
        from cardseg.base.progress import JsonProgress
        from cardseg.io.written import _pass_on, muted_native_stderr

        stop = threading.Event()

        def catcher():
            while not stop.is_set():
                with muted_native_stderr() as lines:
                    os.write(2, b"native noise\\n")
                    time.sleep(0.002)
                _pass_on(lines)

        threads = [threading.Thread(target=catcher) for _ in range(3)]
        for t in threads:
            t.start()
        p = JsonProgress()
        p.stage("write", 300)
        for _ in range(300):
            p.advance(1)
            time.sleep(0.0005)
        stop.set()
        for t in threads:
            t.join()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    done, noise = [], 0
    for line in proc.stderr.splitlines():
        if line == "native noise":
            noise += 1
            continue
        done.append(json.loads(line)["done"])  # anything else must be one whole progress object
    assert done == list(range(301)) and noise > 10
