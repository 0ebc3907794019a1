"""The runtime and the light CLI commands never import TensorFlow or Keras."""

from __future__ import annotations

import subprocess
import sys

from helpers import run_cli


def test_import_runtime_leaves_tensorflow_and_keras_out_of_sys_modules():
    code = (
        "import sys, time; t = time.perf_counter(); import edgekit.runtime; "
        "from edgekit.runtime import Model; Model; "
        "print(time.perf_counter() - t); "
        "print(','.join(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tf_keras', 'cv2')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    seconds, modules = out.strip().splitlines() + [""] * (2 - len(out.strip().splitlines()))
    assert modules == "", f"importing edgekit.runtime loaded {modules}"
    assert float(seconds) < 2.0  # generous here; the 0.5 s goal is measured in tests/perf


def test_version_help_and_bench_help_do_not_import_tensorflow():
    for args in (["--version"], ["--help"], ["bench", "--help"], ["convert", "--help"]):
        result = run_cli(*args)
        assert result.returncode == 0, (args, result.stderr)
        assert result.imports == [] and result.modules == [], f"edgekit {' '.join(args)}: {result.import_sites}"


def test_version_prints_the_package_version():
    from edgekit import __version__

    result = run_cli("--version")
    assert __version__ in result.stdout


def test_convert_without_tensorflow_names_the_install_command(tmp_path):
    model = tmp_path / "m.keras"
    model.write_bytes(b"PK\x03\x04 not really")
    result = run_cli("convert", model, block_tf=True)
    assert result.returncode == 9
    assert "tensorflow" in result.probes and result.imports == []  # the check looked, and stopped before importing
    assert len(result.error_lines) == 1
    assert "pip install 'edgekit[convert]'" in result.error_lines[0]


def test_nothing_named_runtime_or_converters_lands_at_top_level():
    import importlib.util

    import edgekit.converters
    import edgekit.runtime

    assert edgekit.runtime.__name__ == "edgekit.runtime"
    assert edgekit.converters.__name__ == "edgekit.converters"
    for top in ("runtime", "converters"):
        spec = importlib.util.find_spec(top)
        assert spec is None or "site-packages" not in (spec.origin or ""), spec
