"""Files the program creates (locks, temporary files, tables) are never opened through a link
or reused when another user or a hard link put them there: a planted name is refused in one line
and the file it points at keeps every byte."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cardseg.base.files import FileLock, open_new_file, write_atomic
from conftest import run_cli_quiet

VICTIM_TEXT = b"the victim's own bytes\n"


@pytest.fixture()
def victim(tmp_path) -> Path:
    """A file outside every output folder that an attacker would like overwritten."""
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(VICTIM_TEXT)
    return path


def test_a_lock_planted_as_a_symlink_is_refused(tmp_path, victim):
    lock_path = tmp_path / ".res.cardseg.lock"
    lock_path.symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        FileLock(lock_path).acquire()
    assert victim.read_bytes() == VICTIM_TEXT
    assert lock_path.is_symlink()  # not the program's to remove


def test_a_lock_planted_as_a_hard_link_is_refused(tmp_path, victim):
    lock_path = tmp_path / ".cardseg-batch.lock"
    os.link(victim, lock_path)
    with pytest.raises(OSError, match="did not make"):
        FileLock(lock_path).acquire()
    assert victim.read_bytes() == VICTIM_TEXT


def test_a_leftover_lock_of_a_killed_run_is_taken_and_rewritten(tmp_path):
    lock_path = tmp_path / ".res.cardseg.lock"
    lock_path.write_bytes(b"99999999 and more than a pid\n")
    lock = FileLock(lock_path)
    assert lock.acquire()
    assert lock_path.read_bytes() == f"{os.getpid()}\n".encode()
    lock.release()
    assert not lock_path.exists()


def test_write_atomic_never_writes_through_a_planted_temporary_name(tmp_path, victim):
    target = tmp_path / "report.json"
    (tmp_path / ".report.json.tmp").symlink_to(victim)
    with pytest.raises(OSError, match="did not make"):
        write_atomic(target, b"{}")
    assert victim.read_bytes() == VICTIM_TEXT
    assert not target.exists()


def test_write_atomic_replaces_its_own_leftover(tmp_path):
    target = tmp_path / "state.json"
    (tmp_path / ".state.json.tmp").write_bytes(b"half a state from a killed run")
    write_atomic(target, b"{}")
    assert target.read_bytes() == b"{}"
    assert not (tmp_path / ".state.json.tmp").exists()


def test_open_new_file_makes_a_fresh_file(tmp_path):
    path = tmp_path / "fresh.bin"
    with os.fdopen(open_new_file(path), "wb") as f:
        f.write(b"x")
    assert path.read_bytes() == b"x"


def test_segment_refuses_a_planted_lock_and_keeps_the_previous_output(tmp_path, victim, tiny_bundle, phantom_file):
    out = tmp_path / "res"
    args = ["segment", str(phantom_file), "-o", str(out), "--bundle", str(tiny_bundle), "--method", "uc"]
    rc, err = run_cli_quiet(args)
    assert rc == 0, err
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    (tmp_path / ".res.cardseg.lock").symlink_to(victim)
    rc, err = run_cli_quiet(args + ["--overwrite"])
    assert rc == 2
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "symbolic link" in lines[0], err
    assert victim.read_bytes() == VICTIM_TEXT
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("name", [".patient1.cardseg-tmp", ".patient2.cardseg-old", ".p.cardseg.lock", ".cardseg-tmp"])
def test_an_output_named_like_a_leftover_is_refused(tmp_path, tiny_bundle, phantom_file, name):
    out = tmp_path / name
    rc, err = run_cli_quiet(["segment", str(phantom_file), "-o", str(out), "--bundle", str(tiny_bundle)])
    assert rc == 2
    assert "temporary files" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_a_batch_outdir_named_like_a_leftover_is_refused(tmp_path):
    from cardseg.base.errors import CardsegError
    from cardseg.cohort.state import check_batch_outdir

    with pytest.raises(CardsegError, match="temporary files"):
        check_batch_outdir(tmp_path / ".cohort.cardseg-old", {}, False)
    assert not (tmp_path / ".cohort.cardseg-old").exists()
