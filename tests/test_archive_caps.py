""".keras archives are capped before anything unpacks them (README "Untrusted models"): member count,
sizes and a 200:1 compression ratio. Each zip is built here with zipfile and goes through the real CLI;
the refusal is a one-line exit 3 that names the cap, and it comes before TensorFlow is imported."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import zipfile
import zlib

import pytest

from edgekit.converters.model_safety import MAX_CONFIG_BYTES, MAX_MEMBERS, MAX_RATIO, read_archive_config
from edgekit.errors import ModelFormatError

# the run reports whether TensorFlow was imported: the caps must hold before the heavy loader runs
CLI = ("import sys\nfrom edgekit.cli import main\ntry:\n    main(sys.argv[1:], prog_name='edgekit')\n"
       "finally:\n    sys.stdout.write('@@tf ' + str('tensorflow' in sys.modules) + '\\n')\n")


def convert(path, tmp_path):
    out = tmp_path / "out.tflite"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("EDGEKIT_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", CLI, "convert", str(path), "-o", str(out)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert not out.exists()
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert proc.stdout.strip().endswith("@@tf False"), "TensorFlow was imported before the archive was checked"
    return proc.returncode, lines[0]


CONFIG = '{"class_name": "Sequential", "config": {"layers": []}}'


def test_too_many_members(tmp_path):
    path = tmp_path / "many.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("config.json", CONFIG)
        for i in range(MAX_MEMBERS):  # config.json + 10,000 = one more than the cap
            zf.writestr(f"assets/{i}", b"")
    assert len(zipfile.ZipFile(path).infolist()) == MAX_MEMBERS + 1
    code, line = convert(path, tmp_path)
    assert code == 3
    assert line == f"edgekit: error: {path}: the archive holds {MAX_MEMBERS + 1} files, over the cap of 10,000; refusing"


def test_as_many_members_as_the_cap_allows_are_read(tmp_path):
    path = tmp_path / "at_cap.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("config.json", CONFIG)
        for i in range(MAX_MEMBERS - 1):
            zf.writestr(f"assets/{i}", b"")
    assert read_archive_config(path)["class_name"] == "Sequential"


def test_a_config_member_larger_than_its_cap(tmp_path):
    path = tmp_path / "big_config.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:  # stored: a ratio of 1, only the size is wrong
        zf.writestr("config.json", CONFIG + " " * (MAX_CONFIG_BYTES + 1 - len(CONFIG)))
    code, line = convert(path, tmp_path)
    assert code == 3
    assert line == f"edgekit: error: {path}: config.json is {MAX_CONFIG_BYTES + 1} bytes, over the cap of 64 MiB; refusing"


def _claim_sizes(path, size: int) -> None:
    """Rewrite the uncompressed size of every member in the zip's central directory (what a crafted
    archive does: the listing promises gigabytes that the file does not hold)."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at != -1:
        data[at + 24 : at + 28] = struct.pack("<I", size)
        at = data.find(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))


def test_members_that_unpack_to_more_than_16_gib_in_all(tmp_path):
    path = tmp_path / "huge.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("config.json", CONFIG)
        for i in range(4):
            zf.writestr(f"part{i}.weights.h5", b"x" * 64)
    _claim_sizes(path, 0xF000_0000)  # 5 members x 3.75 GiB = 18.75 GiB
    assert sum(m.file_size for m in zipfile.ZipFile(path).infolist()) > 16 * 1024**3
    code, line = convert(path, tmp_path)
    assert code == 3
    assert line == f"edgekit: error: {path}: the archive unpacks to more than 16 GiB; refusing"


def test_a_member_compressed_more_than_200_to_1_is_a_zip_bomb(tmp_path):
    path = tmp_path / "bomb.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("config.json", CONFIG)
        zf.writestr("model.weights.h5", b"\0" * (4 * 1024**2))
    member = zipfile.ZipFile(path).getinfo("model.weights.h5")
    ratio = member.file_size // member.compress_size
    assert ratio > 1000
    code, line = convert(path, tmp_path)
    assert code == 3
    assert line == f"edgekit: error: {path}: model.weights.h5 is compressed {ratio}:1, over the cap of 200:1, a zip bomb; refusing"


def _compressible(ratio_wanted: float, size: int) -> bytes:
    """`size` bytes of zeros sprinkled with seeded random bytes, tuned to deflate by about `ratio_wanted`."""
    rng = random.Random(0)
    lo, hi = 1, 100_000
    while lo < hi:  # the spacing of random bytes that gives the wanted ratio
        gap = (lo + hi) // 2
        data = bytearray(size)
        for i in range(0, size, gap):
            data[i] = rng.randrange(256)
        if size / len(zlib.compress(bytes(data))) < ratio_wanted:
            lo = gap + 1
        else:
            hi = gap
    data = bytearray(size)
    for i in range(0, size, lo):
        data[i] = rng.randrange(256)
    return bytes(data)


def test_a_member_just_below_200_to_1_is_not_a_bomb(tmp_path):
    path = tmp_path / "dense.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("config.json", CONFIG)
        zf.writestr("model.weights.h5", _compressible(150, 2 * 1024**2))
    member = zipfile.ZipFile(path).getinfo("model.weights.h5")
    assert 100 < member.file_size / member.compress_size < MAX_RATIO
    # past the caps: the next check (weights declared vs stored) and Keras decide; not a bomb
    assert read_archive_config(path)["class_name"] == "Sequential"


def test_small_members_may_compress_well(tmp_path):
    """The ratio cap applies above 1 MiB: a 1 MiB config of spaces is ordinary JSON, not a bomb."""
    path = tmp_path / "spaces.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("config.json", CONFIG + " " * (1024**2 - len(CONFIG)))
    info = zipfile.ZipFile(path).getinfo("config.json")
    assert info.file_size / info.compress_size > MAX_RATIO
    assert read_archive_config(path)["class_name"] == "Sequential"


def test_a_truncated_archive_is_a_model_format_error(tmp_path):
    path = tmp_path / "cut.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("config.json", CONFIG)
        zf.writestr("model.weights.h5", os.urandom(4096))
    path.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(ModelFormatError, match="cut.keras"):
        read_archive_config(path)
    code, line = convert(path, tmp_path)
    assert code == 3 and line.startswith(f"edgekit: error: {path}:")
