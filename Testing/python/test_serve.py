"""``cardseg serve``, the warm engine (issue 25): real engine processes on the ``cardseg synth``
phantom with the tiny test bundle.

One process answers several requests: the second gives the same outputs as a one-shot
``cardseg segment``; a bad request is answered with a one-line error and the next one still
works; a changed bundle is loaded again; ``monai`` is never imported when the ONNX backend runs
from a warm cache; the end of input ends the engine, also in the middle of a request (nothing
half written). Through the module's client (:mod:`CARDSegmentLib.runs.engine`): cancel kills the
process and the next run starts a new one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import SimpleITK as sitk

REPO = Path(__file__).resolve().parents[2]
MODULE_DIR = REPO / "CARDSegment"
CARDSEG = [sys.executable, "-m", "cardseg"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
HAS_ONNX = importlib.util.find_spec("onnxruntime") is not None


@pytest.fixture(scope="module")
def phantom(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("phantom") / "phantom.nii.gz"
    subprocess.run(CARDSEG + ["synth", str(path)], check=True, capture_output=True, timeout=120, env=ENV)
    return path


class Serve:
    """A ``cardseg serve`` child: send requests, read its protocol lines from stdout."""

    def __init__(self, *args: str, preexec_fn=None):
        self.proc = subprocess.Popen(
            CARDSEG + ["serve", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=ENV,
            preexec_fn=preexec_fn,
        )
        self.progress: list = []

    def send(self, obj) -> None:
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def event(self, timeout: float = 300.0) -> dict:
        """The next event line (progress lines on the way are kept in :attr:`progress`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"the engine ended: {self.proc.wait(30)}, {self.proc.stderr.read()[-2000:]}")
            obj = json.loads(line)  # stdout holds protocol lines only
            if "event" in obj:
                return obj
            self.progress.append(obj)
        raise AssertionError("no event in time")

    def ask(self, obj) -> dict:
        self.send(obj)
        return self.event()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def run_one_shot(phantom: Path, out: Path, bundle: Path, backend: str) -> dict:
    subprocess.run(
        CARDSEG
        + [
            "segment",
            str(phantom),
            "-o",
            str(out),
            "--bundle",
            str(bundle),
            "--backend",
            backend,
            "--progress",
            "none",
            "--threads",
            "1",
        ],
        check=True,
        capture_output=True,
        timeout=600,
        env=ENV,
    )
    return json.loads((out / "report.json").read_text())


def image(path: Path) -> np.ndarray:
    return sitk.GetArrayFromImage(sitk.ReadImage(str(path)))


@pytest.mark.skipif(not HAS_ONNX, reason="needs onnxruntime (the [speed] extra)")
def test_one_process_many_requests(tmp_path, phantom, tiny_bundle):
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    # the one-shot reference run also fills the ONNX cache: the engine then starts from a warm cache
    ref = run_one_shot(phantom, tmp_path / "one-shot", bundle, "onnx")
    engine = Serve("--bundle", str(bundle), "--backend", "onnx", "--threads", "1")
    try:
        ready = engine.event()
        assert ready["event"] == "ready" and ready["error"] is None and ready["backend"] == "onnx"
        first = engine.ask({"id": "a", "input": str(phantom), "output": str(tmp_path / "a")})
        assert first["ok"] and first["id"] == "a" and first["loaded_bundle"] is False, first
        # a bad request gets one line, and the engine goes on
        bad = engine.ask({"id": "b", "input": str(tmp_path / "missing.nii.gz"), "output": str(tmp_path / "b")})
        assert bad == {
            "event": "result",
            "id": "b",
            "ok": False,
            "code": 2,
            "error": f"{tmp_path / 'missing.nii.gz'}: no such file or folder",
        }
        wrong = engine.ask({"id": "c", "input": str(phantom), "output": str(tmp_path / "c"), "method": "nope"})
        assert not wrong["ok"] and "invalid choice: 'nope'" in wrong["error"] and not (tmp_path / "c").exists()
        assert "--help" not in wrong["error"]  # a request is JSON, not a command line: no CLI hint
        assert not engine.ask("not json")["ok"]
        taken = engine.ask({"id": "d", "input": str(phantom), "output": str(tmp_path / "a")})  # no overwrite
        assert not taken["ok"] and "--overwrite" in taken["error"]
        second = engine.ask({"id": "e", "input": str(phantom), "output": str(tmp_path / "e")})
        assert second["ok"] and second["loaded_bundle"] is False, second
        # ONNX sessions keep their threads: a request with another count opens them again, once
        for rid, loaded in (("t1", True), ("t2", False)):
            more = engine.ask({"id": rid, "input": str(phantom), "output": str(tmp_path / rid), "threads": 2})
            assert more["ok"] and more["loaded_bundle"] is loaded, more
        back = engine.ask({"id": "t3", "input": str(phantom), "output": str(tmp_path / "t3")})  # --threads 1 again
        assert back["ok"] and back["loaded_bundle"] is True, back
        status = engine.ask({"id": "s", "op": "status"})
        assert status["pid"] == ready["pid"] == engine.proc.pid
        assert status["requests"] == 8 and status["bundle"]["backend"] == "onnx"
        if importlib.util.find_spec("monai") is not None:  # installed, and still never imported
            assert status["modules"]["monai"] is False
        assert status["modules"]["onnxruntime"] is True
        # the progress lines are cardseg segment's --progress json lines
        assert any(p["stage"] == "trajectory" for p in engine.progress)
        assert all(set(p) == {"stage", "done", "total"} for p in engine.progress)

        # the second request's outputs are the one-shot run's
        out, one = tmp_path / "e", tmp_path / "one-shot"
        assert sorted(second["files"]) == sorted(p.name for p in one.iterdir() if not p.name.startswith("."))
        np.testing.assert_array_equal(image(out / "segmentation.nii.gz"), image(one / "segmentation.nii.gz"))
        np.testing.assert_array_equal(image(out / "regions.nii.gz"), image(one / "regions.nii.gz"))
        for name in ("probabilities.nii.gz", "disagreement.nii.gz", "temperature.nii.gz"):
            np.testing.assert_allclose(image(out / name), image(one / name), atol=1e-6)
        rep = json.loads((out / "report.json").read_text())
        assert rep["agreement"] == pytest.approx(ref["agreement"], abs=1e-9) == second["agreement"]
        assert rep["regions"] == ref["regions"] and rep["backend"] == ref["backend"] == "onnx"

        # a weight file rewritten with the same bytes is checked again but not reloaded;
        # a bundle refitted on disk (bundle.json rewritten) is loaded again by the next request
        from cardseg.bundle.loading import update_config

        weights = bundle / "reference.safetensors"
        weights.write_bytes(weights.read_bytes())
        same = engine.ask({"id": "g", "input": str(phantom), "output": str(tmp_path / "g")})
        assert same["ok"] and same["loaded_bundle"] is False
        update_config(bundle, {"calibration": {"tau_max": 2.5}})
        third = engine.ask({"id": "f", "input": str(phantom), "output": str(tmp_path / "f")})
        assert third["ok"] and third["loaded_bundle"] is True
        assert json.loads((tmp_path / "f" / "report.json").read_text())["calibration"]["tau_max"] == 2.5
        # a weight file altered on disk is refused as cardseg segment refuses it, nothing written
        weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
        broken = engine.ask({"id": "h", "input": str(phantom), "output": str(tmp_path / "h")})
        assert not broken["ok"] and broken["code"] == 2 and "checksum mismatch" in broken["error"]
        assert not (tmp_path / "h").exists()

        engine.proc.stdin.close()  # end of input: the engine says so and exits 0
        assert engine.event() == {"event": "exit", "reason": "eof"}
        assert engine.proc.wait(60) == 0
    finally:
        engine.close()


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("sigint", ["handled", "ignored"])
def test_end_of_input_stops_a_running_request(tmp_path, tiny_bundle, sigint):
    """The client went away mid-request: the work stops at once, nothing half written, exit 0;
    also in an engine that a script started in the background, where SIGINT is ignored (Python's
    own way to interrupt the main thread then does nothing)."""
    big = tmp_path / "big.nii.gz"
    # 200 slices at batch size 1: a thousand network calls, so even on a loaded machine the request is
    # still running when the engine reads the end of its input (48 slices could finish first)
    subprocess.run(CARDSEG + ["synth", str(big), "--slices", "200"], check=True, capture_output=True, timeout=120)
    engine = Serve(
        "--bundle",
        str(tiny_bundle),
        "--backend",
        "torch",
        "--threads",
        "1",
        "--no-preload",
        preexec_fn=_ignore_sigint if sigint == "ignored" else None,
    )
    try:
        assert engine.event()["event"] == "ready"
        engine.send({"id": 1, "input": str(big), "output": str(tmp_path / "out"), "batch_size": 1})
        while not engine.progress or engine.progress[-1]["stage"] != "trajectory":
            line = engine.proc.stdout.readline()
            assert line, engine.proc.stderr.read()[-2000:]
            engine.progress.append(json.loads(line))
        engine.proc.stdin.close()
        result = engine.event()
        assert result["id"] == 1 and not result["ok"] and "stopped" in result["error"]
        assert engine.event() == {"event": "exit", "reason": "eof"}
        assert engine.proc.wait(60) == 0
    finally:
        engine.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.nii.gz"]  # no output, temporary or lock


def test_sigterm_ends_an_idle_engine(tmp_path, tiny_bundle):
    engine = Serve("--bundle", str(tiny_bundle), "--backend", "torch", "--no-preload")
    try:
        assert engine.event()["event"] == "ready"
        engine.proc.send_signal(signal.SIGTERM)
        assert engine.event() == {"event": "exit", "reason": "terminated"}
        assert engine.proc.wait(60) == 143
    finally:
        engine.close()


def test_client_cancel_kills_the_engine_and_the_next_run_starts_another(tmp_path, phantom, tiny_bundle):
    if str(MODULE_DIR) not in sys.path:
        sys.path.insert(0, str(MODULE_DIR))
    from CARDSegmentLib.runs import process as proc
    from CARDSegmentLib.runs.engine import Engine

    def command(out: str, src: Path = phantom) -> proc.SegmentCommand:
        return proc.SegmentCommand(
            str(src),
            str(tmp_path / out),
            bundle_path=str(tiny_bundle),
            method="card",
            python_executable=sys.executable,
            engine_dir=str(MODULE_DIR),
            threads=1,
            batch_size=1,
            extra_env={"OMP_NUM_THREADS": "1", "CARDSEG_BACKEND": "torch"},
        )

    engine = Engine()
    try:
        run = engine.run(command("one"))
        run.start()
        assert run.wait(300) == proc.SUCCEEDED, (run.error, run.log[-5:])
        pid = engine.handle.pid
        assert run.result["slices"] == 10 and (tmp_path / "one" / "report.json").is_file()

        run = engine.run(command("two"))
        run.start()
        deadline = time.monotonic() + 120
        while run.poll() == proc.RUNNING and run.progress.stage != "trajectory" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert run.progress.stage == "trajectory"
        run.cancel()
        assert run.state == proc.CANCELLED and engine.handle is None
        with pytest.raises(ProcessLookupError):  # killed and reaped at once
            os.kill(pid, 0)

        run = engine.run(command("three"))
        run.start()
        assert run.wait(300) == proc.SUCCEEDED, (run.error, run.log[-5:])
        assert engine.starts == 2 and engine.handle.pid != pid

        # a bad run is one line and the engine stays up for the next
        bad = engine.run(command("four", tmp_path / "missing.nii.gz"))
        bad.start()
        assert bad.wait(60) == proc.FAILED and bad.error == f"{tmp_path / 'missing.nii.gz'}: no such file or folder"
        assert engine.alive and engine.starts == 2
    finally:
        engine.close()
    assert not engine.alive


def test_a_line_nested_too_deep_is_one_refusal_and_the_engine_goes_on(tmp_path, tiny_bundle):
    """json.loads raises RecursionError (not ValueError) on deep nesting: it killed the engine."""
    engine = Serve("--bundle", str(tiny_bundle), "--backend", "torch", "--no-preload")
    try:
        assert engine.event()["event"] == "ready"
        for depth in (995, 100_000):
            answer = engine.ask("[" * depth)
            assert answer["ok"] is False and answer["code"] == 2 and answer["error"].startswith("not a JSON request")
        assert engine.ask({"op": "status", "id": 7})["event"] == "status"  # still serving
    finally:
        engine.close()


def test_an_answer_holding_a_non_finite_number_is_still_strict_json():
    """The protocol writes a NaN or an infinity (a measure that could not be taken) as null."""
    import io

    from cardseg.serve import Protocol

    stream = io.StringIO()
    Protocol(stream).send({"event": "result", "id": 3, "agreement": float("nan"), "volumes": [1.5, float("-inf")]})
    line = stream.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line, parse_constant=lambda name: pytest.fail(name)) == {
        "event": "result",
        "id": 3,
        "agreement": None,
        "volumes": [1.5, None],
    }


def test_nan_or_infinity_in_a_request_is_refused_and_every_answer_is_strict_json(tmp_path, tiny_bundle):
    """Python's json reads NaN/Infinity; the engine echoed such an id back as invalid JSON."""

    def strict(line: str) -> dict:
        return json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in an answer: {line}"))

    engine = Serve("--bundle", str(tiny_bundle), "--backend", "torch", "--no-preload")
    try:
        assert strict(engine.proc.stdout.readline())["event"] == "ready"
        for bad in (
            '{"id": NaN, "op": "status"}',
            '{"id": [1, -Infinity]}',
            '{"op": "status", "x": Infinity}',
            '{"id": 1e999, "op": "status"}',
            '{"op": "status", "id": -1e400}',
        ):
            engine.send(bad)
            answer = strict(engine.proc.stdout.readline())
            assert answer["ok"] is False and answer["code"] == 2 and answer["id"] is None, answer
            assert answer["error"].startswith("not a JSON request")
            assert "is not a JSON value" in answer["error"] or "out of range" in answer["error"]
        engine.send({"op": "status", "id": 1.5})
        assert strict(engine.proc.stdout.readline())["id"] == 1.5  # finite numbers are still ids
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["stop", "finish"])
def test_requests_queued_when_the_input_ends_run_only_with_eof_finish(tmp_path, phantom, tiny_bundle, mode):
    """``--eof stop`` (the default): the requests still queued when the input ends never run (all
    three of them used to); ``--eof finish`` runs them all."""
    lines = "".join(
        json.dumps({"id": i, "input": str(phantom), "output": str(tmp_path / f"o{i}")}) + "\n" for i in (1, 2, 3)
    )
    p = subprocess.run(
        CARDSEG + ["serve", "--bundle", str(tiny_bundle), "--backend", "torch", "--threads", "1", "--eof", mode],
        input=lines,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    events = [json.loads(x) for x in p.stdout.splitlines() if '"event"' in x]
    done = [e["id"] for e in events if e["event"] == "result" and e["ok"]]
    assert p.returncode == 0 and events[-1] == {"event": "exit", "reason": "eof"}
    if mode == "finish":
        assert done == [1, 2, 3]
    else:  # the first request may have started before the end was read: then it was stopped
        assert done == [] and not any((tmp_path / f"o{i}").exists() for i in (2, 3))


def test_help_says_each_default_once_and_never_none():
    p = subprocess.run(
        CARDSEG + ["serve", "--help"], capture_output=True, text=True, env={**ENV, "COLUMNS": "200"}, timeout=120
    )
    assert p.returncode == 0 and "(default: None)" not in p.stdout
    assert "(default: $CARDSEG_BUNDLE or the shipped one)" in p.stdout and "(default: stop)" in p.stdout


def test_a_line_over_the_limit_is_refused_unread_and_the_engine_goes_on(tmp_path, tiny_bundle):
    from cardseg.serve import MAX_REQUEST_BYTES

    engine = Serve("--bundle", str(tiny_bundle), "--backend", "torch", "--no-preload")
    try:
        assert engine.event()["event"] == "ready"
        answer = engine.ask('{"op": "status", "id": "' + "x" * (2 * MAX_REQUEST_BYTES) + '"}')
        assert answer["ok"] is False and answer["code"] == 2 and "at most" in answer["error"]
        assert len(json.dumps(answer)) < 1000  # the line is not echoed back
        assert engine.ask({"op": "status", "id": 8})["id"] == 8  # the rest of the long line was dropped
    finally:
        engine.close()


@pytest.mark.parametrize("path", ["in\u0000put.nii.gz", "in\udcffput.nii.gz"])
def test_a_path_no_file_name_can_hold_is_one_refusal(tmp_path, tiny_bundle, path):
    engine = Serve("--bundle", str(tiny_bundle), "--backend", "torch", "--no-preload")
    try:
        assert engine.event()["event"] == "ready"
        line = json.dumps({"input": str(tmp_path / path), "output": str(tmp_path / "out"), "id": 3})
        answer = engine.ask(line)
        assert answer["ok"] is False and answer["code"] == 2, answer
        assert "\n" not in answer["error"] and "Traceback" not in answer["error"]
        assert engine.ask({"op": "status", "id": 4})["id"] == 4
    finally:
        engine.close()
    assert not (tmp_path / "out").exists()


def test_a_client_that_stops_reading_ends_the_engine_with_a_line_on_stderr(tiny_bundle):
    engine = Serve("--bundle", str(tiny_bundle), "--backend", "torch", "--no-preload")
    try:
        assert engine.event()["event"] == "ready"
        engine.proc.stdout.close()  # the client reads no more answers
        for i in range(3):
            try:
                engine.send({"op": "status", "id": i})
            except BrokenPipeError:  # it has gone already
                break
        assert engine.proc.wait(120) == 0
        assert "stopped reading" in engine.proc.stderr.read()
    finally:
        engine.close()
