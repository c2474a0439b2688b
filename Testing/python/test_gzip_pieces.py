"""The written volumes' gzip: one ordinary gzip member whose deflate stream is made of pieces
compressed on several threads (``cardseg.io.written._gzip_file``), read back exactly by Python's
gzip, zlib and SimpleITK, about as small as one stream, and written whole at any size."""

from __future__ import annotations

import gzip
import zlib

import numpy as np
import pytest
import SimpleITK as sitk

from cardseg.base.cpus import usable_cpus
from cardseg.io import written


def _float_map(nbytes: int, seed: int = 0) -> bytes:
    """Something like a probability map: smooth float32 values with long runs of zeros."""
    rng = np.random.default_rng(seed)
    a = np.clip(np.cumsum(rng.normal(0, 0.02, nbytes // 4 + 1)), 0, None).astype(np.float32)
    a[(np.arange(a.size) // 5000) % 3 == 0] = 0.0
    return a.tobytes()[:nbytes]


@pytest.mark.parametrize("pieces_of", [64 * 1024, 1 << 21])
@pytest.mark.parametrize("size_in_pieces", [0.0, 0.5, 1.0, 3.25])
def test_any_size_comes_back_exactly_as_one_gzip_member(tmp_path, monkeypatch, pieces_of, size_in_pieces):
    monkeypatch.setattr(written, "PIECE_BYTES", pieces_of)
    data = _float_map(int(size_in_pieces * pieces_of) + (1 if size_in_pieces == 1.0 else 0), seed=pieces_of)
    src, dst = tmp_path / "x.raw", tmp_path / "x.gz"
    src.write_bytes(data)
    written._gzip_file(src, dst)
    packed = dst.read_bytes()
    assert gzip.decompress(packed) == data
    d = zlib.decompressobj(31)  # one member: nothing left after it
    assert d.decompress(packed) == data and d.eof and d.unused_data == b""
    assert packed[:4] == b"\x1f\x8b\x08\x00" and packed[4:8] == b"\0\0\0\0"  # no name, time 0


def test_pieces_cost_little_size_against_one_stream(tmp_path, monkeypatch):
    """Each piece is primed with the 32 KiB before it: on data whose repeats cross the pieces'
    borders (a 20 KiB block over and over) the pieces end within 3 % of one stream, where
    unprimed pieces would be far larger."""
    monkeypatch.setattr(written, "PIECE_BYTES", 64 * 1024)
    block = np.random.default_rng(3).integers(0, 256, 20 * 1024, dtype=np.uint8).tobytes()
    data = block * 60
    (tmp_path / "x.raw").write_bytes(data)
    written._gzip_file(tmp_path / "x.raw", tmp_path / "x.gz")
    primed = (tmp_path / "x.gz").stat().st_size
    one = len(gzip.compress(data, compresslevel=written.GZIP_LEVEL, mtime=0))
    pieces = [data[i : i + written.PIECE_BYTES] for i in range(0, len(data), written.PIECE_BYTES)]
    unprimed = sum(
        len(written._deflate(p, b"", written.GZIP_LEVEL, i == len(pieces) - 1)) for i, p in enumerate(pieces)
    )
    assert primed <= 1.03 * one and primed < 0.7 * unprimed  # 19 pieces: their block ends cost 1 %


def test_reading_ahead_stays_bounded_and_an_early_stop_cancels_what_is_queued(monkeypatch):
    """At most min(2 threads, MAX_AHEAD) pieces are read ahead of the one handed out; a caller
    that stops (a failed write) leaves no queued piece to be compressed. A stand-in pool runs the
    first piece at once and holds the others, so the order is fixed."""
    import io
    from concurrent.futures import Future

    monkeypatch.setattr(written, "PIECE_BYTES", 1024)
    held = []

    class Pool:
        def submit(self, fn, *args):
            f = Future()
            if not held and not getattr(self, "ran", False):
                self.ran = True
                f.set_result(fn(*args))
            else:
                held.append(f)
            return f

    for threads in (1, 3, 20):
        held.clear()
        monkeypatch.setattr(written, "_pool", lambda: (Pool(), threads))
        reads = []

        class Counting(io.BytesIO):
            def read(self, n=-1):
                reads.append(n)
                return super().read(n)

        pieces = written._deflate_pieces(Counting(bytes(100 * 1024)), 1)
        first = next(pieces)
        ahead = min(2 * threads, written.MAX_AHEAD)
        assert len(first[0]) == 1024 and len(reads) == ahead + 1 and len(held) == ahead - 1
        pieces.close()  # the caller stopped: what was queued is cancelled
        assert held and all(f.cancelled() for f in held)


def test_the_pool_follows_the_runs_threads():
    try:
        for n in (3, 1):
            written.set_threads(n)
            pool, workers = written._pool()
            assert workers == n and pool._max_workers == n
            assert pool is written._pool()[0]  # kept while the count stays
        written.set_threads(None)
        assert written._pool()[1] == usable_cpus()
    finally:
        written.set_threads(None)


def test_a_volume_written_in_pieces_reads_back_in_simpleitk(tmp_path, monkeypatch):
    monkeypatch.setattr(written, "PIECE_BYTES", 64 * 1024)  # a 1.3 MB volume: about 20 pieces
    arr = np.random.default_rng(1).random((5, 4, 120, 140)).astype(np.float32)
    arr[:, :, :30] = 0
    img = sitk.GetImageFromArray(arr, isVector=False)
    written.write_image(img, tmp_path / "p.nii.gz")
    assert np.array_equal(sitk.GetArrayFromImage(sitk.ReadImage(str(tmp_path / "p.nii.gz"))), arr)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p.nii.gz"]


def test_a_failing_disk_is_one_incomplete_write(tmp_path, monkeypatch):
    src = tmp_path / "x.raw"
    src.write_bytes(_float_map(300_000))
    monkeypatch.setattr(written, "PIECE_BYTES", 64 * 1024)

    real = written._deflate_pieces

    def failing(fin, level):
        for i, item in enumerate(real(fin, level)):
            if i == 2:
                raise OSError(28, "No space left on device")
            yield item

    monkeypatch.setattr(written, "_deflate_pieces", failing)
    with pytest.raises(written.IncompleteWrite, match="x.gz"):
        written._gzip_file(src, tmp_path / "x.gz")


def test_a_forked_child_compresses_with_its_own_threads(tmp_path, monkeypatch):
    """The parent's pool threads do not exist in a forked child: the child makes its own (with
    the parent's pool it would wait for ever)."""
    import multiprocessing

    monkeypatch.setattr(written, "PIECE_BYTES", 64 * 1024)
    data = _float_map(400_000, seed=9)
    (tmp_path / "x.raw").write_bytes(data)
    written._gzip_file(tmp_path / "x.raw", tmp_path / "parent.gz")  # the parent's pool exists now
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=written._gzip_file, args=(tmp_path / "x.raw", tmp_path / "child.gz"))
    child.start()
    child.join(60)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0
    assert gzip.decompress((tmp_path / "child.gz").read_bytes()) == data
