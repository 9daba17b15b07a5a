"""The direct one-chunk writer produces what zarr itself writes, and zarr reads it back."""
import json

import numpy as np
import pytest
import zarr

from pipeline.store import format as fmt


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64, np.uint8])
@pytest.mark.parametrize("kind", ["empty", "compressible", "random"])
def test_direct_write_equals_zarr_metadata_and_reads_back(tmp_path, dtype, kind):
    rng = np.random.default_rng(0)
    n = {"empty": 0, "compressible": 300_000, "random": 300_000}[kind]
    if kind == "random":
        arr = rng.integers(0, 256, n).astype(dtype) if dtype == np.uint8 else (rng.random(n) * 1e6).astype(dtype)
    else:
        arr = (np.arange(n) % 7).astype(dtype)
    g = str(tmp_path / "g")
    fmt.make_group(g, {"encoding-type": "csr_matrix"})
    fmt.write_array(g, "a", arr)
    got = zarr.open_array(store=g, path="a", mode="r")[...]
    assert got.dtype == arr.dtype and np.array_equal(got, arr)
    assert zarr.open_group(store=g, mode="r").attrs["encoding-type"] == "csr_matrix"
    compress = fmt._worth_compressing(arr)
    if kind == "compressible":
        assert compress  # a repeating pattern is worth compressing
    if kind == "random" and dtype in (np.float32, np.float64):
        assert not compress  # random mantissas are stored raw
    zarr.create_array(store=str(tmp_path / "z"), name="a", shape=arr.shape, dtype=arr.dtype,
                      chunks=(max(1, n),), compressors=fmt._COMPRESSORS if compress else None)
    ours = json.loads((tmp_path / "g" / "a" / "zarr.json").read_text())
    theirs = json.loads((tmp_path / "z" / "a" / "zarr.json").read_text())
    assert ours == theirs


def test_rewrite_replaces_the_array(tmp_path):
    g = str(tmp_path / "g")
    fmt.make_group(g)
    fmt.write_array(g, "a", np.arange(10, dtype=np.int64))
    fmt.write_array(g, "a", np.arange(3, dtype=np.float32))
    assert np.array_equal(fmt.read_array(g, "a"), np.arange(3, dtype=np.float32))


@pytest.mark.parametrize("chunk", [None, 1000])
def test_read_array_reads_what_zarr_writes(tmp_path, chunk):
    """Arrays zarr itself wrote (one chunk or several, compressed or not) read back through read_array."""
    a = np.arange(5000, dtype=np.int64) * 3
    for comp in (fmt._COMPRESSORS, None):
        zarr.create_array(store=str(tmp_path), name="x", shape=a.shape, dtype=a.dtype,
                          chunks=(chunk or a.shape[0],), compressors=comp, overwrite=True)[:] = a
        assert np.array_equal(fmt.read_array(str(tmp_path), "x"), a)


@pytest.mark.parametrize("kind", ["compressible", "random"])
def test_read_array_into_out_when_dtype_matches(tmp_path, kind):
    rng = np.random.default_rng(1)
    arr = np.arange(70_000, dtype=np.int32) if kind == "compressible" else rng.integers(0, 2**31, 70_000, np.int32)
    fmt.make_group(str(tmp_path))
    fmt.write_array(str(tmp_path), "a", arr)
    out = np.full(80_000, -1, np.int32)
    got = fmt.read_array(str(tmp_path), "a", out=out)
    assert np.shares_memory(got, out) and np.array_equal(got, arr) and (out[70_000:] == -1).all()
    for other in (np.zeros(80_000, np.int64), np.zeros(60_000, np.int32), np.zeros(160_000, np.int32)[::2]):
        got = fmt.read_array(str(tmp_path), "a", out=other)  # wrong dtype, too short, strided: a new array
        assert not np.shares_memory(got, other) and got.dtype == np.int32 and np.array_equal(got, arr)
        assert not other.any()


def test_read_raw_reads_a_range_of_a_raw_array_and_names_a_short_file(tmp_path):
    """A range [a, b) of a raw one-chunk array reads as the array's slice (into ``out``'s head when it fits);
    a chunk file shorter than the range is an error naming the file."""
    g = str(tmp_path)
    fmt.make_group(g)
    arr = np.random.default_rng(2).integers(0, 2**40, 50_000)  # random: stored raw
    fmt.write_array(g, "a", arr, compress=False)
    assert fmt.raw_map(g, "a") is not None
    for a, b in ((0, 50_000), (123, 4_567), (49_999, 50_000), (7, 7)):
        assert np.array_equal(fmt.read_raw(g, "a", arr.dtype, a, b), arr[a:b])
    out = np.full(10_000, -1, np.int64)
    got = fmt.read_raw(g, "a", arr.dtype, 100, 5_100, out)
    assert np.shares_memory(got, out) and np.array_equal(got, arr[100:5_100]) and (out[5_000:] == -1).all()
    with pytest.raises(fmt.StoreError, match=r"a/c/0.*\[49000, 51000\)"):
        fmt.read_raw(g, "a", arr.dtype, 49_000, 51_000)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64, np.float32, np.float64])
def test_codec_writes_numcodecs_frames_into_a_reused_buffer(dtype, monkeypatch):
    from numcodecs import Blosc

    from pipeline.store import codec

    ref = Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0)
    rng = np.random.default_rng(0)
    for n in (0, 1, 1000, 300_000):
        a = np.sort(rng.integers(0, 1000, n)).astype(dtype)
        assert bytes(codec.encode(a)) == ref.encode(a)
    a, b = (np.arange(50_000, dtype=dtype) * k for k in (1, 3))
    ea = codec.encode(a)
    assert bytes(ea) == ref.encode(a)
    eb = codec.encode(b)  # the same thread buffer: the earlier frame is overwritten
    assert np.shares_memory(np.frombuffer(ea, np.uint8), np.frombuffer(eb, np.uint8))
    assert bytes(eb) == ref.encode(b)
    fresh = codec.encode(a, reuse=False)
    assert not np.shares_memory(np.frombuffer(fresh, np.uint8), np.frombuffer(eb, np.uint8))
    monkeypatch.setattr(codec, "REUSE_BYTES", 1000)  # larger frames are not kept by the thread
    big = codec.encode(b)
    assert bytes(big) == ref.encode(b) and not np.shares_memory(np.frombuffer(big, np.uint8), np.frombuffer(eb, np.uint8))


def test_codec_encodes_a_strided_view_like_its_copy():
    from pipeline.store import codec

    a = np.arange(10_000, dtype=np.int64)[::3]
    assert bytes(codec.encode(a)) == bytes(codec.encode(a.copy()))
