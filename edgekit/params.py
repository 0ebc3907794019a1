"""The parameters of `bench` (edgekit.bench, edgekit.bench_on), `run` (edgekit.run's open_model, open_source
and run_stream), `inspect` (edgekit.inspect), `doctor` (edgekit.remote's doctor_on and Session) and `demo`
(edgekit.demo.run_demo), declared once in the library's names; the CLI renders them as flags
(edgekit/cli_options.py) and a test holds them to the functions' signatures. `sweep` declares its own on
SweepSettings (edgekit/sweeper.py), `convert` on the recipe (converters/recipe.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgekit.declare import option, required
from edgekit.errors import UsageError
from edgekit.runtime.decoders import DECODERS
from edgekit.runtime.delegates import TARGETS
from edgekit.runtime.tasks import TASKS

DELEGATE_HELP = "Override the model's delegate hints: cpu, gpu, npu or a delegate library path."
HOST_METAVAR = "[USER@]HOST[:PORT]"
REMOTE_PYTHON_HELP = "--on: the device's Python with edgekit."
CONNECT_TIMEOUT_HELP = "--on: seconds per SSH connect."


@dataclass(frozen=True)
class BenchParams:
    """What `edgekit.bench` takes besides the models (`bench_on` takes these but `baseline`)."""

    threads: int | None = option(None, "Interpreter threads [all cores].", kind=int)
    runs: int = option(100, "Timed invokes after warm-up.", kind=int)
    warmup: int = option(10, "Untimed invokes before the timed ones.", kind=int)
    reference: Path | None = option(None, "Float model to compare against: Keras, SavedModel, or a float "
                                    ".tflite (run without TensorFlow; with --on, copied to and run on the "
                                    "device, so only a .tflite).", kind=Path)
    baseline: Path | None = option(None, "A .tflite (the dense file) benched first; each model's speed-up is "
                                   "against its p50.", kind=Path)
    data: Path | None = option(None, "Labelled image folder (class sub-folders), or .npz/.npy samples (input names "
                               "or x; y labels).", kind=Path)
    output: str | None = option(None, "Output scored in the top1/agree columns [first class-score one].",
                                metavar="NAME")
    delegate: str | None = option(None, DELEGATE_HELP)
    strict: bool = option(False, "An unreadable --data image is an error (default: skip, report).", kind=bool)


@dataclass(frozen=True)
class RemoteParams:
    """What `edgekit.bench_on` takes to reach the devices (`hosts`: `bench --on`)."""

    hosts: tuple[str, ...] = option((), "Measure on this device over SSH, with its own edgekit; the models, --data "
                                    "and a .tflite --reference are copied there (repeat: hosts run in parallel).",
                                    flag="--on", repeat=True, metavar=HOST_METAVAR)
    remote_python: str = option("python3", REMOTE_PYTHON_HELP)
    remote_data: str | None = option(None, "--on: labelled data already on the device (not copied).",
                                     metavar="PATH")
    connect_timeout: float = option(10.0, CONNECT_TIMEOUT_HELP, kind=float)
    timeout: float = option(600.0, "--on: seconds for the whole run.", kind=float)
    keep_remote: bool = option(False, "--on: keep the copies on the device for the next run.", kind=bool)


def thread_count(text: str) -> int | str:
    """`run`'s threads as the CLI gives them: a number, or auto."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{text!r} is neither a number nor auto") from None


@dataclass(frozen=True)
class RunParams:
    """What `edgekit run` takes: `source` (open_source), `threads`, `delegate` and `probe` (open_model), the
    rest (run_stream)."""

    source: str = required("Camera index (0), /dev/video*, URL, picamera2, video, image, folder, glob, or "
                           ".npy/.npz samples.")
    task: str | None = option(None, "[from the model's outputs]", choices=tuple(TASKS))
    top_k: int = option(1, "Best classes shown per frame (classify).", kind=int)
    threshold: float = option(0.5, "Minimum detection score.", kind=float)
    decode: str | None = option(None, "Detections from a raw YOLO or SSD head, or the TFLite post-processing op "
                                "[from the model].", choices=DECODERS)
    anchors: Path | None = option(None, "--decode ssd: (N, 4) anchors .npy (yc, xc, h, w).", kind=Path)
    iou: float | None = option(None, "--decode yolo|ssd: NMS IoU threshold [0.45].", kind=float)
    background: bool | None = option(None, "--decode ssd: class 0 is background [when the scores have one column "
                                     "more than the labels].", kind=bool)
    threads: int | str | None = option(None, "Interpreter threads, or auto: every core but the one decoding "
                                       "frames [all cores].", parse=thread_count, metavar="N|AUTO")
    max_frames: int | None = option(None, "Stop after N frames.", kind=int)
    batch: int = option(16, "Image folders: classify N images per invoke (1: one by one). Cameras and videos: "
                        "always 1.", kind=int)
    save_dir: Path | None = option(None, "Write annotated frames here.", kind=Path)
    show: bool = option(False, "Show annotated frames in a window (q quits).", kind=bool)
    force: bool = option(False, "Replace existing files in --save-dir.", kind=bool)
    delegate: str | None = option(None, DELEGATE_HELP)
    probe: bool | None = option(None, "Load and run the model once in a child process first: always / never. "
                                "[files not probed before on this runtime; edgekit convert's own outputs need "
                                "none]", kind=bool)
    full_frames: bool = option(False, "Decode every video frame whole. [Motion-JPEG: at 1/8, 1/4, 3/8 ... when "
                               "that covers the input and no frame is drawn]", kind=bool)


OPEN_MODEL = ("threads", "delegate", "probe")  # the RunParams open_model takes; `source` is open_source's


@dataclass(frozen=True)
class InspectParams:
    """What `edgekit.inspect` takes besides the model."""

    runtimes: tuple[str, ...] = option((), "Check loading on a runtime, e.g. tflite-runtime==2.14 or "
                                       "ai-edge-litert==2.3 (repeatable).", flag="--runtime", repeat=True)
    gpu: bool = option(True, "Skip the GPU delegate compatibility analysis.", negated=True, kind=bool)
    probe: bool = option(False, "Also load and run it once in a child process (untrusted models).", kind=bool)
    target: str | None = option(None, "Judge it for this accelerator (as convert's --target): the ops it leaves "
                                "on the CPU, and why.", choices=TARGETS)


@dataclass(frozen=True)
class DoctorParams:
    """What `edgekit doctor` takes to report on devices: `hosts` (doctor_on's), the rest its Session's (none:
    this machine's report, edgekit.runtime.doctor.diagnose)."""

    hosts: tuple[str, ...] = option((), "The device's report, over SSH (repeat for several; JSON: a list with "
                                    "`host` in each).", flag="--on", repeat=True, metavar=HOST_METAVAR)
    remote_python: str = option("python3", REMOTE_PYTHON_HELP)
    connect_timeout: float = option(10.0, CONNECT_TIMEOUT_HELP, kind=float)


@dataclass(frozen=True)
class DemoParams:
    """What `edgekit.demo.run_demo` takes besides where it says what it does."""

    data: Path | None = option(None, "Digits data with train/ and test/ [the digits bundled with edgekit].",
                               kind=Path)
    out: Path = option(Path("edgekit-demo"), "Folder for the trained model, its .tflite files and bench.json.",
                       kind=Path)
    epochs: int = option(20, "Training epochs.", kind=int)
    seed: int = option(0, "Seed of the training and of the calibration shuffle.", kind=int)
    runs: int = option(200, "Timed invokes per model in the benchmark.", kind=int)
    force: bool = option(False, "Replace files left by an earlier demo in --out.", kind=bool)
