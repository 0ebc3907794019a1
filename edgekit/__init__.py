"""edgekit: get a trained Keras model onto a small device, smaller and faster, and prove the cost.

    import edgekit

    result = edgekit.convert(keras_model, mode="int8", calib=images, output="model.tflite",
                             calibration=edgekit.CalibrationSpec(samples=300))
    report = edgekit.bench(result.path, data="images/", reference="model.keras")
    on_pi = edgekit.bench_on(["pi@raspberrypi.local"], result.path, data="images/")  # over SSH
    edgekit.inspect(result.path, runtimes=["tflite-runtime==2.14"]).check_runtimes()

`import edgekit` loads neither TensorFlow nor LiteRT: each function imports what it needs when called
(`convert` and `sweep` need `pip install "edgekit[convert]"`). On a device, `edgekit.runtime.Model`
runs the files. Errors are `edgekit.EdgekitError` subclasses, each with its CLI exit code.
"""

from edgekit._version import __version__
from edgekit.errors import (
    BudgetMissedError,
    CalibrationError,
    ConversionError,
    EdgekitError,
    InputShapeError,
    InvokeError,
    MissingDependencyError,
    ModelFormatError,
    OutputExistsError,
    RemoteError,
    SourceDisconnectedError,
    UnsafeModelError,
    UnsupportedOpsError,
    UsageError,
)

_API = ("convert", "convert_in_child", "bench", "bench_on", "inspect", "sweep", "sweep_in_child", "tune", "tune_in_child",
        "BenchReport", "InspectReport", "SweepReport", "TuneReport")
_SPECS = ("BudgetSpec", "CalibrationSpec", "ConvertRecipe", "ConvertResult", "ModelInfo", "Preprocessing",
          "PruningSpec", "TrainingSpec")

__all__ = ["__version__", *_API, *_SPECS, "BudgetMissedError", "CalibrationError", "ConversionError", "EdgekitError", "InputShapeError",  # noqa: PLE0604
           "InvokeError", "MissingDependencyError", "ModelFormatError", "OutputExistsError",
           "RemoteError", "SourceDisconnectedError", "UnsafeModelError", "UnsupportedOpsError", "UsageError"]


def __getattr__(name: str):
    """The API functions and result types, imported on first use (they live in edgekit.api)."""
    if name in _API:
        from edgekit import api

        return getattr(api, name)
    if name in _SPECS:
        from edgekit.converters import recipe, results

        return getattr(results if name == "ConvertResult" else recipe, name)
    raise AttributeError(f"module 'edgekit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
