"""ai-edge-quantizer (PyPI `litert-quantizer`) as a second post-training int8 backend.

Google's LiteRT quantizer works on the float `.tflite` itself, calibrates through the LiteRT interpreter and
quantizes with its own per-op policy. Its default static recipe (`static_wi8_ai8`: int8 activations per
tensor, int8 weights per channel, min/max calibration) differs from TFLite's converter in how a range is
set: each sample's min and max are folded into a moving average (factor 0.95) instead of the extremes over
all samples, so one outlier sample stretches nothing. Neither backend wins everywhere (issue 17: better than
the converter on a MobileNetV2 on 6 of 8 calibration subsets, far worse on a face-crop classifier), so
`converters/ranges.py` scores it as one more candidate (`aeq`) beside the converter's range methods and keeps
it only where it measures better.

Its recipe would make the model's inputs and outputs int8; edgekit keeps them float32 (QUANTIZE / DEQUANTIZE
at the edges), so it is a candidate for `--io float32` only, and only where the package is installed (the
`convert` extra installs it).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from edgekit.errors import ConversionError

NAME = "aeq"


def float_model(calibrated: bytes) -> bytes:
    """The converter's calibrated model without its recorded ranges: the float model the quantizer reads
    (a tensor with quantization parameters counts as already quantized there)."""
    from edgekit.runtime.schema import pack, unpack

    model = unpack(calibrated)
    for graph in model.subgraphs:
        for tensor in graph.tensors:
            q = tensor.quantization
            if q is not None and q.scale is None and q.zeroPoint is None:
                tensor.quantization = None
    return pack(model, len(calibrated))


def quantize(model: bytes, samples: list) -> bytes:
    """int8 by ai-edge-quantizer's static a8w8 recipe with float32 inputs and outputs, calibrated on
    `samples` (representative-dataset entries: a list in input order, or a dict by signature input name)."""
    from litert_quantizer import calibrator, model_modifier, params_generator, recipe, recipe_manager
    from litert_quantizer.utils import tfl_flatbuffer_utils

    key, names = _signature(model)
    # the graph's inputs and outputs stay float: it inserts QUANTIZE / DEQUANTIZE (its default is int8 I/O)
    plan = recipe.static_wi8_ai8() + [{"regex": ".*", "operation": edge, "algorithm_key": "no_quantize"}
                                      for edge in ("INPUT", "OUTPUT")]
    try:
        with warnings.catch_warnings():  # its calibrator keeps every tensor, and LiteRT warns that this is for debugging
            warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors")
            manager = recipe_manager.RecipeManager()
            manager.load_quantization_recipe(plan)
            calib = _quiet(calibrator.Calibrator(model, num_threads=os.cpu_count() or 1))
            for sample in samples:
                calib.calibrate({key: [sample if isinstance(sample, dict) else dict(zip(names, sample))]}, manager)
            # Quantizer.quantize's two steps, with their progress bars off (it does not pass that to the second)
            graph = tfl_flatbuffer_utils.read_model(model)
            params = params_generator.ParamsGenerator(graph).generate_quantization_parameters(
                manager, calib.get_model_qsvs(), enable_progress_bar=False)
            quantized = model_modifier.ModelModifier(graph).modify_model(params, enable_progress_bar=False)
    except Exception as exc:  # noqa: BLE001 - a third-party quantizer: any failure is one line
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ConversionError(f"ai-edge-quantizer could not quantize this model: {detail}") from None
    return _versioned(bytes(quantized), samples[:PROBE_SAMPLES])


PROBE_SAMPLES = 4


def _quiet(calib):
    """The quantizer's calibrator without its tqdm bar: `calibrate` draws one on stderr when a call has 100 op
    steps or more (any model of 100 ops: a MobileNetV3Small, an EfficientNetB0) and has no switch for it.
    The bar is sized by `_get_total_operations`; this instance's answers 0 (it sizes nothing else; the
    package forbids subclassing its Calibrator, and a renamed method leaves only the bar back)."""
    calib._get_total_operations = lambda calibration_dataset: 0  # noqa: SLF001 - this instance only
    return calib


def _versioned(quantized: bytes, probe: list) -> bytes:
    """The quantizer leaves every op at version 1, which would tell `inspect --runtime` that an int8 CONV_2D
    runs on runtimes that predate int8 kernels. TFLite's flatbuffer export sets each op's version from its
    types: the model goes through TFLite's quantizer, which finds nothing left to quantize (outputs measured
    bit-identical on the digits CNN and a MobileNetV2) and exports it with the right versions.
    (`mlir_sparsify`, the other export entry, re-encodes a MobileNetV2's int8 weights as sparse.)
    The export folds ops that compute on constants only (the SHAPE / GATHER / CONCATENATION chains of a
    ViT's or an EfficientNet's reshapes): where the op count changes, the two models must give identical
    outputs on the `probe` samples, else the file is not used."""
    from edgekit.converters.quantize import quantize_calibrated
    from edgekit.runtime.schema import schema_module

    out = quantize_calibrated(quantized, "float32")
    s = schema_module()
    before, after = s.Model.GetRootAs(quantized, 0).Subgraphs(0), s.Model.GetRootAs(out, 0).Subgraphs(0)
    if before.OperatorsLength() != after.OperatorsLength() and not _same_outputs(quantized, out, probe):
        raise ConversionError("ai-edge-quantizer's model changed when its op versions were set; not used")
    return out


def _same_outputs(a: bytes, b: bytes, probe: list) -> bool:
    """Do two models give bit-identical outputs on `probe` (samples as lists in input order)? A model that
    does not run at its stored input sizes (an open-size U-Net) gives no answer: False."""
    from ai_edge_litert.interpreter import Interpreter

    if not probe or isinstance(probe[0], dict):
        return False
    outputs = []
    try:
        for model in (a, b):
            interp = Interpreter(model_content=model)
            interp.allocate_tensors()
            got = []
            for sample in probe:
                for d, x in zip(interp.get_input_details(), sample):
                    interp.set_tensor(d["index"], np.asarray(x, d["dtype"]))
                interp.invoke()
                got += [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]
            outputs.append(got)
    except (RuntimeError, ValueError):  # LiteRT's errors for a model it cannot run as given
        return False
    return all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(*outputs))


def _signature(model: bytes) -> tuple[str, list[str]]:
    """The first signature's key and its input names in the order of the interpreter's inputs."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=model)
    signatures: dict[str, Any] = interp.get_signature_list()
    if not signatures:
        raise ConversionError("ai-edge-quantizer needs a model signature; this .tflite has none")
    key = next(iter(signatures))
    by_index = {d["index"]: name for name, d in interp.get_signature_runner(key).get_input_details().items()}
    return key, [by_index[d["index"]] for d in interp.get_input_details()]
