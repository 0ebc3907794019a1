"""`edgekit demo`: the main job on bundled data, end to end, in one command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edgekit.errors import UsageError

DEMO_MODES = ("float32", "float16", "dynamic", "int8")


def bundled_digits() -> Path:
    """The digits that ship in the package (edgekit/data), else those of the source checkout."""
    from importlib.resources import files

    packaged = Path(str(files("edgekit"))) / "data" / "digits"
    checkout = Path(__file__).resolve().parents[1] / "calibration_data" / "digits"
    for candidate in (packaged, checkout):
        if (candidate / "train").is_dir() and (candidate / "test").is_dir():
            return candidate
    raise UsageError("the bundled digits are missing from this installation (edgekit/data/digits); "
                     "reinstall edgekit or pass --data DIR with train/ and test/")


def run_demo(*, data: Path | None = None, out: Path = Path("edgekit-demo"), epochs: int = 20, seed: int = 0,
             runs: int = 200, force: bool = False, say: Callable[[str], None], show: Callable[[str], None]) -> dict:
    import json
    import os

    from edgekit.converters.demo_model import train_digits
    from edgekit.converters.pipeline import convert
    from edgekit.converters.recipe import ConvertRecipe
    from edgekit.files import atomic_write_text, check_writable
    from edgekit.harness import BenchSettings, bench
    from edgekit.report import bench_table

    if epochs < 1:
        raise UsageError(f"must be at least 1, got {epochs}", param="epochs")
    settings = BenchSettings(threads=os.cpu_count() or 1, runs=runs, warmup=20)
    data = data or bundled_digits()
    train, test = data / "train", data / "test"
    if not train.is_dir() or not test.is_dir():
        raise UsageError(f"{data}: needs train/ and test/ class folders")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file; give a folder", param="out")
    out.mkdir(parents=True, exist_ok=True)
    keras_path = out / "digits.keras"
    targets = [keras_path, out / "bench.json"] + [out / f"digits.{m}.tflite" for m in DEMO_MODES]
    for t in targets:
        check_writable(t, force)

    say(f"training a small CNN on {train} (seed {seed}, {epochs} epochs)")
    model, _ = train_digits(train, epochs=epochs, seed=seed, progress=say)
    tmp = keras_path.with_name(".digits.tmp.keras")
    model.save(tmp)
    os.replace(tmp, keras_path)
    paths = []
    for mode in DEMO_MODES:
        result = convert(ConvertRecipe(model=keras_path, mode=mode, calib=train, seed=seed,
                                       output=out / f"digits.{mode}.tflite", force=force))
        v = result.metadata["verification"]
        say(f"converted {mode}: {result.size_bytes} bytes, top-1 agreement "
            f"{100 * v['top1_agreement']:.1f}% on {v['samples']} calibration samples")
        paths.append(result.path)
    say(f"benchmarking on the held-out {test}")
    report = bench(paths, settings, data=test, reference=keras_path)
    atomic_write_text(out / "bench.json", json.dumps(report, indent=2) + "\n", force=force)
    show(bench_table(report))
    show(f"wrote {keras_path}, {len(paths)} .tflite files and {out / 'bench.json'}")
    return report
