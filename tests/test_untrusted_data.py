"""Data a user points edgekit at, read within bounds (runtime/imagesize.py, runtime/arrays.py): an image whose
header declares more pixels than the limit is refused before it is decoded, a .npy/.npz header that claims
more than it holds or than the limit is refused before allocation, no pickle is ever loaded, a .npz member
that is no .npy is refused, a data folder's dangling links, FIFOs and symlink loops are skipped and counted,
and a file name that is not UTF-8 never reaches OpenCV. Each through the commands, one generator per class."""

from __future__ import annotations

import functools
import json
import os
import shutil
import struct
import time
import subprocess
import sys
import zipfile
import zlib

import numpy as np
import pytest

from conftest import ROOT
from edgekit.errors import CalibrationError, InputShapeError
from edgekit.runtime import read_image
from edgekit.runtime.arrays import load_arrays
from edgekit.runtime.imagesize import image_size

SIDE = 30_000  # 900 MP: 2.7 GB decoded as RGB


@functools.lru_cache(maxsize=None)
def _png_of_zeros(width: int, height: int) -> bytes:
    """A valid grayscale PNG: 875 KB that OpenCV would decode into width x height bytes."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    comp = zlib.compressobj(9)
    row = b"\0" * (width + 1)
    idat = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def _huge_headers():
    """(suffix, bytes) whose header declares SIDE x SIDE pixels, one per format edgekit reads from folders."""
    yield ".png", _png_of_zeros(SIDE, SIDE)
    yield ".jpg", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + \
        b"\xff\xc0\x00\x11\x08" + struct.pack(">HH", SIDE, SIDE) + b"\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    yield ".bmp", b"BM" + struct.pack("<IHHI", 54, 0, 0, 54) + struct.pack("<IiiHHIIiiII", 40, SIDE, SIDE, 1, 24,
                                                                               0, 0, 0, 0, 0, 0)
    yield ".webp", b"RIFF" + struct.pack("<I", 30) + b"WEBPVP8X" + struct.pack("<I", 10) + b"\0" * 4 + \
        (SIDE - 1).to_bytes(3, "little") + (SIDE - 1).to_bytes(3, "little")
    yield ".tif", b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 2) + \
        struct.pack("<HHII", 256, 4, 1, SIDE) + struct.pack("<HHII", 257, 4, 1, SIDE) + b"\0\0\0\0"
    yield ".pgm", b"P5\n# big\n%d %d\n255\n" % (SIDE, SIDE)


def test_every_format_states_its_size_where_image_size_reads_it(tmp_path):
    import cv2
    from PIL import Image

    img = (np.random.default_rng(0).random((37, 53, 3)) * 255).astype(np.uint8)
    for ext in (".png", ".jpg", ".bmp", ".webp", ".tif", ".ppm"):
        cv2.imwrite(str(tmp_path / f"a{ext}"), img)
    Image.fromarray(img).save(tmp_path / "a.gif")
    Image.fromarray(img).save(tmp_path / "l.webp", lossless=True)
    for path in sorted(tmp_path.iterdir()):
        assert image_size(path.read_bytes()) == (37, 53), path.name
    for suffix, data in _huge_headers():
        assert image_size(data) == (SIDE, SIDE), suffix


def _peak_mb(code: str, *args) -> tuple[int, str]:
    """Run `code` in a child, return (peak resident MB, its stdout). VmHWM, not ru_maxrss: the latter keeps
    the forking parent's peak across exec (pytest's, with TensorFlow loaded)."""
    wrapped = code + ("\nimport re; print('PEAK', int(re.search(r'VmHWM:\\s+(\\d+)', "
                      "open('/proc/self/status').read()).group(1)) // 1024)")
    done = subprocess.run([sys.executable, "-c", wrapped, *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]
    peak = int(done.stdout.split("PEAK")[-1])
    return peak, done.stdout


def test_an_image_declaring_900_megapixels_is_refused_before_decoding_in_bounded_memory(tmp_path):
    for suffix, data in _huge_headers():
        path = tmp_path / f"huge{suffix}"
        path.write_bytes(data)
        with pytest.raises(InputShapeError, match="more than 100,000,000 pixels"):
            read_image(path)
    peak, out = _peak_mb("import sys\nfrom edgekit.runtime import read_image\ntry:\n    read_image(sys.argv[1])\n"
                         "except Exception as e:\n    print(type(e).__name__)", tmp_path / "huge.png")
    assert "InputShapeError" in out and peak < 1024, peak


def test_the_pixel_limit_is_configurable(tmp_path, monkeypatch, digits_dir):
    photo = next((digits_dir / "test" / "1").glob("*.png"))
    monkeypatch.setenv("EDGEKIT_MAX_IMAGE_PIXELS", "63")
    with pytest.raises(InputShapeError, match="more than 63 pixels"):
        read_image(photo)
    monkeypatch.setenv("EDGEKIT_MAX_IMAGE_PIXELS", "64")
    assert read_image(photo).shape == (8, 8)


def _npy_header(shape, descr="<f4") -> bytes:
    import io

    fh = io.BytesIO()
    np.lib.format.write_array_header_1_0(fh, {"descr": descr, "fortran_order": False, "shape": shape})
    return fh.getvalue()


@pytest.fixture(scope="module")
def hostile_arrays(tmp_path_factory):
    return _hostile_arrays(tmp_path_factory.mktemp("arrays"))


def _hostile_arrays(tmp_path):
    """(name, path): a generator per class of bad numpy file."""
    (tmp_path / "claims-4tb.npy").write_bytes(_npy_header((10**12,)) + b"\0" * 16)
    (tmp_path / "claims-more.npy").write_bytes(_npy_header((1000, 8, 8, 1)) + b"\0" * 64)
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "strings.npy", np.array(["a", "b"]))
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED) as zf:  # 130 KB: 128 MiB of zeros
        with zf.open("x.npy", "w", force_zip64=True) as fh:
            fh.write(_npy_header((2**25,)))
            for _ in range(8):
                fh.write(b"\0" * (1 << 24))
    with zipfile.ZipFile(tmp_path / "not-npy.npz", "w") as zf:
        zf.writestr("x.txt", "hello")
    with zipfile.ZipFile(tmp_path / "claims-4tb.npz", "w") as zf:
        zf.writestr("x.npy", _npy_header((10**12, 8, 8, 1)) + b"\0" * 64)
    with zipfile.ZipFile(tmp_path / "pickle-member.npz", "w") as zf:
        zf.writestr("x.npy", _npy_header((1,), "|O") + b"\x80\x04N.")
    (tmp_path / "truncated.npz").write_bytes(b"PK\x03\x04" + b"\0" * 20)
    os.mkfifo(tmp_path / "fifo.npy")
    return sorted((p.name, p) for p in tmp_path.iterdir())


def test_hostile_numpy_files_are_refused_before_allocation(hostile_arrays):
    for name, path in hostile_arrays:
        with pytest.raises(InputShapeError) as err:
            load_arrays(path)
        assert str(path) in str(err.value) and "\n" not in str(err.value), name


@pytest.mark.parametrize("command", ["bench", "convert"])
def test_hostile_numpy_files_through_the_commands_are_one_line_in_bounded_memory(tmp_path, converted, hostile_arrays,
                                                                                  digits_keras, command):
    from helpers import run_cli_many

    cases = hostile_arrays
    if command == "bench":
        argvs = [["bench", converted("int8"), "--data", path, "--runs", "2"] for _, path in cases]
        want = 6
    else:
        argvs = [["convert", digits_keras, "--int8", "--calib", path, "--output", tmp_path / "o.tflite"]
                 for _, path in cases]
        want = 4
    many = run_cli_many(argvs, cwd=ROOT)
    for (name, _), run in zip(cases, many.runs):
        lines = run.error_lines
        assert run.returncode == want or (name == "fifo.npy" and run.returncode == 2), (name, run.returncode, lines)
        assert len(lines) == 1 and lines[0].startswith("edgekit: error:"), (name, lines)
    assert many.peak_mb < 1024, many.peak_mb  # over all ten cases, TensorFlow loaded for convert
    assert not (tmp_path / "o.tflite").exists()


def test_a_data_folder_with_dangling_links_fifos_loops_and_a_huge_image_is_read_and_counted(tmp_path, converted,
                                                                                           digits_dir):
    data = tmp_path / "data"
    shutil.copytree(digits_dir / "test", data)
    (data / "3" / "huge.png").write_bytes(_png_of_zeros(SIDE, SIDE))
    (data / "3" / "dangling.png").symlink_to(tmp_path / "nothing.png")
    os.mkfifo(data / "4" / "fifo.png")
    (data / "5" / "loop").symlink_to(data)
    done = subprocess.run([sys.executable, "-m", "edgekit.cli", "bench", str(converted("int8")), "--data", str(data),
                           "--runs", "2", "--json", "-"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-800:]
    report = json.loads(done.stdout)
    assert report["data"]["samples"] == 360
    skipped = report["data"].get("skipped")
    assert skipped == 3 or len(skipped) == 3, report["data"]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["bench", "run", "convert"])
def test_a_file_name_that_is_not_utf8_is_read_and_printed_without_a_crash(tmp_path, converted, digits_keras,
                                                                          digits_dir, command):
    data = tmp_path / "data"
    shutil.copytree(digits_dir / "test", data)
    first = sorted((data / "7").glob("*.png"))[0]
    os.rename(first, os.path.join(os.fsencode(data / "7"), b"seven-\xff\xfe.png"))
    args = {"bench": ["bench", str(converted("int8")), "--data", str(data), "--runs", "2"],
            "run": ["run", str(converted("int8")), "--source", str(data / "7")],
            "convert": ["convert", str(digits_keras), "--int8", "--calib", str(data), "--output",
                        str(tmp_path / "o.tflite")]}[command]
    done = subprocess.run([sys.executable, "-m", "edgekit.cli", *args], capture_output=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-800:]
    assert b"Traceback" not in done.stderr
    if command == "run":
        assert done.stdout.count(b"\n") == 36 and b"seven-" in done.stdout


def test_a_jpeg_hiding_a_small_frame_header_behind_a_stuffed_zero_is_measured_as_libjpeg_reads_it(tmp_path):
    """FF 00 is no marker to libjpeg: a parser that took it for one skipped the real 800x600 frame header
    and found a 1x1 one hidden in an APP15 segment. The header reader now walks markers as libjpeg does
    (and decode_image refuses a decode larger than its header said)."""
    import cv2

    from edgekit.runtime import imagesize

    ok, jpeg = cv2.imencode(".jpg", np.zeros((600, 800, 3), np.uint8))
    data = jpeg.tobytes()
    at = data.find(b"\xff\xc0")
    fake = b"\xff\xc0\x00\x11\x08\x00\x01\x00\x01\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    evil = data[:at] + b"\xff\x00" + struct.pack(">H", 4) + b"\xff\xef" + struct.pack(">H", 2 + len(fake)) + fake + \
        data[at:]
    assert cv2.imdecode(np.frombuffer(evil, np.uint8), 1).shape == (600, 800, 3)  # the premise
    assert imagesize.image_size(evil) == (600, 800)


@pytest.mark.parametrize("ext", [".jp2", ".ras", ".hdr", ".pfm", ".exr"])
def test_formats_whose_size_cannot_be_read_before_decoding_are_refused(tmp_path, ext):
    import cv2

    path = tmp_path / f"a{ext}"
    try:
        written = cv2.imwrite(str(path), np.zeros((60, 80, 3), np.float32 if ext in (".hdr", ".pfm", ".exr") else np.uint8))
    except cv2.error:
        written = False
    if not written:  # this OpenCV build has no encoder for it: the bytes of another unparsed format then
        path.write_bytes(b"\x00\x00\x00\x0cjP  \r\n\x87\n" + b"\0" * 64)
    with pytest.raises(InputShapeError, match="not a readable image"):
        read_image(path)


def test_a_pnm_header_of_many_comments_is_read_in_linear_time():
    from edgekit.runtime.imagesize import _pnm

    started = time.monotonic()
    assert _pnm(b"P1 " + b"# \n" * 20_000 + b"x") is None
    assert _pnm(b"P5\n# a comment longer than a kilobyte " + b"#" * 5000 + b"\n12 34\n255\n") == (34, 12)
    assert time.monotonic() - started < 1


def test_a_bomb_of_many_members_each_under_the_floor_and_corrupt_or_odd_arrays_are_refused(tmp_path):
    import io

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": ((64 << 20) // 4 - 32,)})
    blob = header.getvalue() + b"\0" * ((64 << 20) - 128)
    with zipfile.ZipFile(tmp_path / "many.npz", "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(3):
            zf.writestr(f"x{i}.npy", blob)
    np.savez_compressed(tmp_path / "ok.npz", x=np.arange(1000.0))
    corrupt = bytearray((tmp_path / "ok.npz").read_bytes())
    corrupt[60:70] = b"\xff" * 10
    (tmp_path / "corrupt.npz").write_bytes(bytes(corrupt))
    np.save(tmp_path / "complex.npy", np.array([1 + 2j]))
    np.save(tmp_path / "times.npy", np.array([1], dtype="timedelta64[s]"))
    for name, match in (("many.npz", "zip bomb"), ("corrupt.npz", "not a readable numpy file"),
                        ("complex.npy", "bool, integer and float"), ("times.npy", "bool, integer and float")):
        with pytest.raises(CalibrationError, match=match):
            load_arrays(tmp_path / name, error=CalibrationError)
