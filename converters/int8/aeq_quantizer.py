"""ai-edge-quantizer (PyPI `litert-quantizer`) as a second post-training int8 backend.

Google's LiteRT quantizer works on the float `.tflite` itself, calibrates through the LiteRT interpreter and
quantizes with its own per-op policy. Its default static recipe (`static_wi8_ai8`: int8 activations per
tensor, int8 weights per channel, min/max calibration) differs from TFLite's converter in how a range is
set: each sample's min and max are folded into a moving average (factor 0.95) instead of the extremes over
all samples, so one outlier sample stretches nothing. Neither backend wins everywhere (measured: better than
the converter on a MobileNetV2 on 6 of 8 calibration subsets, far worse on a face-crop classifier), so
`converters/int8/choose.py` scores it as one more candidate (`aeq`) beside the converter's range methods and keeps
it only where it measures better.

Its recipe would make the model's inputs and outputs int8; edgekit keeps them float32 (QUANTIZE / DEQUANTIZE
at the edges), so it is a candidate for `--io float32` only, and only where the package is installed (the
`convert` extra installs it).
"""

from __future__ import annotations

import copy
import os
import re
import warnings
from collections.abc import Iterable

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
    `samples` (representative-dataset entries: a list in input order, or a dict by signature input name);
    `model` is the float model, or the converter's calibrated one (its ranges are dropped)."""
    return Calibration(model, samples).quantize()


class Calibration:
    """ai-edge-quantizer's calibration of `model` on `samples`, made once, and the files it makes from it:
    int8 everywhere (its static a8w8 recipe), or with the ops writing some tensors at int16 activations and
    int8 weights (a16w8: TFLite's int16x8 kernels), int8 elsewhere, the quantizer inserting the requantize
    ops between them. The calibrator records each tensor's moving-average min and max (with `min_max`, the
    extremes over all samples, as TFLite's converter) whatever the bit width (the ranges are the same
    statistics), so every mix quantizes from one calibration. It calibrates in its profiler-based mode: LiteRT
    records each tensor's min and max in C++ as it runs; its default mode hands every tensor of every op to
    Python and looks each op's recipe up again for every sample (a ViT's 32 samples: 1.0-1.6 s against
    0.09 s; 2.2 s under a profiler, of a 12 s conversion). The statistics are the same (the ViT's ranges
    within 4e-6 of their span, its int8 outputs bit-identical on 64 samples); the integer shape tensors it
    no longer records are not quantized."""

    def __init__(self, calibrated: bytes, samples: list, min_max: bool = False):
        from litert_quantizer import calibrator
        from litert_quantizer.utils import qsv_utils

        profiled = calibrator.CalibrationMode.CALIBRATION_PROFILER_BASED  # see the class docstring

        self.calibrated, self.probe = calibrated, samples[:PROBE_SAMPLES]
        self.model = model = float_model(calibrated)
        self._versions: dict[bool, tuple] | None = None  # TFLite's op versions (int8, int16x8), made once
        key, names = _signature(model)
        try:
            with warnings.catch_warnings():  # its calibrator keeps every tensor; LiteRT warns that this is for debugging
                warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors")
                manager = _manager(everywhere=True)  # every op it can quantize at int16: each one's tensors recorded
                update = {"qsv_update_func": qsv_utils.min_max_update} if min_max else {}
                calib = _quiet(calibrator.Calibrator(model, num_threads=os.cpu_count() or 1, mode=profiled, **update))
                for sample in samples:
                    calib.calibrate({key: [sample if isinstance(sample, dict) else dict(zip(names, sample))]}, manager)
                self.qsvs = calib.get_model_qsvs()
        except Exception as exc:  # noqa: BLE001 - a third-party quantizer: any failure is one line
            raise _failed(exc) from None

    def quantize(self, int16: Iterable[str] = ()) -> bytes:
        """The file with the ops writing the tensors named in `int16` at a16w8, every other op at a8w8
        (with `int16`, the model given was the converter's calibrated one: see `_versioned_mix`)."""
        int16 = list(int16)
        from litert_quantizer import model_modifier, params_generator
        from litert_quantizer.utils import tfl_flatbuffer_utils

        try:
            manager = _manager(int16=int16)
            # Quantizer.quantize's two steps, with their progress bars off (it does not pass that to the second)
            graph = tfl_flatbuffer_utils.read_model(self.model)
            params = params_generator.ParamsGenerator(graph).generate_quantization_parameters(
                manager, copy.deepcopy(self.qsvs), enable_progress_bar=False)  # it edits them in place
            quantized = model_modifier.ModelModifier(graph).modify_model(params, enable_progress_bar=False)
        except Exception as exc:  # noqa: BLE001 - a third-party quantizer: any failure is one line
            raise _failed(exc) from None
        if not int16:
            return _versioned(bytes(quantized), self.probe)
        return _versioned_mix(bytes(quantized), self._reference_versions())

    def _reference_versions(self) -> dict[bool, tuple]:
        """The op versions of TFLite's own int8 (False) and int16x8 (True) files of the calibrated model."""
        from edgekit.converters.quantize import quantize_calibrated

        if self._versions is None:
            try:
                self._versions = {wide: _op_versions(quantize_calibrated(
                    self.calibrated, "float32", activations="int16" if wide else "int8")) for wide in (False, True)}
            except ConversionError as exc:  # TFLite's int16 quantizer does not take every model (a ViT: no)
                raise ConversionError(f"TFLite cannot make an int16x8 file of this model to take the versions of "
                                      f"the int16 ops from ({exc}); int16x8 mixes not used") from None
        return self._versions


def _manager(int16: Iterable[str] = (), everywhere: bool = False):
    """The recipe: a8w8 on every op it supports, a16w8 on every op (`everywhere`) or on the ops whose one
    output is named in `int16`; the graph's inputs and outputs stay float (QUANTIZE / DEQUANTIZE: its
    default is int8 I/O). Its scopes are an op's output names, each followed by ';', and of the entries
    whose regex matches, the last (in the order each regex was first added) wins, except one the op has no
    kernel for (a16w8 on such an op leaves a8w8). So each layer has a regex of its own: a8w8 '.*', a16w8
    '.' or '^name;$', the float edges '^' (an output's name may be in `int16`)."""
    from litert_quantizer import recipe, recipe_manager

    plan = recipe.static_wi8_ai8()
    wide = recipe.static_wi8_ai16()[0]
    plan += [dict(wide, regex=".")] if everywhere else [dict(wide, regex=f"^{re.escape(name)};$") for name in int16]
    plan += [{"regex": "^", "operation": edge, "algorithm_key": "no_quantize"} for edge in ("INPUT", "OUTPUT")]
    manager = recipe_manager.RecipeManager()
    manager.load_quantization_recipe(plan)
    return manager


def _failed(exc: Exception) -> ConversionError:
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    return ConversionError(f"ai-edge-quantizer could not quantize this model: {detail}")


PROBE_SAMPLES = 4


def _quiet(calib):
    """The quantizer's calibrator without its tqdm bar: `calibrate` draws one on stderr when a call has 100 op
    steps or more (any model of 100 ops: a MobileNetV3Small, an EfficientNetB0) and has no switch for it.
    The bar is sized by `_get_total_operations`; this instance's answers 0 (it sizes nothing else; the
    package forbids subclassing its Calibrator, and a renamed method leaves only the bar back)."""
    calib._get_total_operations = lambda calibration_dataset: 0
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


def _versioned_mix(quantized: bytes, refs: dict[bool, tuple]) -> bytes:
    """A mix of int8 and int16x8 ops, each op code at the version TFLite gives it. TFLite's export cannot
    set them here (it folds the int8 <-> int16 requantize ops into their neighbours and changes what the
    model computes), so the versions are read from TFLite's own files of the same calibrated model (`refs`):
    its int8 one for the int8 ops and its int16x8 one for the ops that read or write int16, matched by output
    name (else the highest version of that op there); QUANTIZE and DEQUANTIZE by op_version.cc's rules for
    the per-tensor int8 / int16 types these mixes have. An op code is shared by all its ops, so it takes the
    highest any of them needs (a runtime that registers a version registers the lower ones with it)."""
    from edgekit.runtime.schema import pack, schema_module, unpack

    s = schema_module()
    model = unpack(quantized)
    graph = model.subgraphs[0]
    need: dict[int, int] = {}
    for op in graph.operators:
        code = _builtin(model.operatorCodes[op.opcodeIndex])
        ins, outs = _indices(op.inputs), _indices(op.outputs)  # numpy arrays, or None
        types = {graph.tensors[i].type for i in ins + outs if i >= 0}
        if code == s.BuiltinOperator.QUANTIZE:
            version = 2 if graph.tensors[outs[0]].type == s.TensorType.INT16 else 1
        elif code == s.BuiltinOperator.DEQUANTIZE:
            version = {s.TensorType.INT16: 3, s.TensorType.INT8: 2}.get(graph.tensors[ins[0]].type, 1)
        else:
            by_name, highest = refs[s.TensorType.INT16 in types]
            name = graph.tensors[outs[0]].name.decode() if outs else ""
            version = by_name.get((code, name)) or highest.get(code)
            if version is None:
                raise ConversionError("ai-edge-quantizer's int8/int16x8 mix has an op TFLite's own files do not "
                                      f"have (builtin {code}): its version is unknown; not used")
        need[op.opcodeIndex] = max(need.get(op.opcodeIndex, 1), version)
    for index, version in need.items():
        model.operatorCodes[index].version = version
    for buffer in model.buffers or ():  # the quantizer stores constants past the flatbuffer, by offset: inline
        if buffer.offset > 1 and buffer.size:  # them, as the packed flatbuffer moves what follows it
            buffer.data = np.frombuffer(quantized, np.uint8, int(buffer.size), int(buffer.offset)).copy()
            buffer.offset = buffer.size = 0
    return pack(model, len(quantized))


def _indices(array) -> list[int]:
    return [] if array is None else [int(i) for i in array]


def _builtin(code) -> int:
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def _op_versions(tflite: bytes) -> tuple[dict[tuple[int, str], int], dict[int, int]]:
    """(builtin code, first output name) -> version, and builtin code -> its highest version, of a file."""
    from edgekit.runtime.schema import unpack

    model = unpack(tflite)
    graph = model.subgraphs[0]
    by_name: dict[tuple[int, str], int] = {}
    highest: dict[int, int] = {}
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        version = code.version
        outs = _indices(op.outputs)
        if outs:
            by_name[(_builtin(code), graph.tensors[outs[0]].name.decode())] = version
        highest[_builtin(code)] = max(highest.get(_builtin(code), 1), version)
    return by_name, highest


def _same_outputs(a: bytes, b: bytes, probe: list) -> bool:
    """Do two models give bit-identical outputs on `probe` (samples as lists in input order)? A model that
    does not run at its stored input sizes (an open-size U-Net) gives no answer: False."""
    from edgekit.runtime.backend import get_backend

    if not probe or isinstance(probe[0], dict):
        return False
    outputs = []
    try:
        for model in (a, b):
            runner = get_backend().runner(model_content=model, num_threads=None)
            got = []
            for sample in probe:
                for d, x in zip(runner.input_details(), sample):
                    runner.set(d["index"], np.asarray(x, d["dtype"]))
                runner.invoke()
                got += [runner.get(d["index"]) for d in runner.output_details()]
            outputs.append(got)
    except (RuntimeError, ValueError):  # LiteRT's errors for a model it cannot run as given
        return False
    return all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(*outputs))


def _signature(model: bytes) -> tuple[str, list[str]]:
    """The first signature's key and its input names in the order of the interpreter's inputs."""
    from edgekit.runtime.backend import get_backend

    runner = get_backend().runner(model_content=model, num_threads=None, allocate=False)
    signatures = runner.signatures()
    if not signatures:
        raise ConversionError("ai-edge-quantizer needs a model signature; this .tflite has none")
    key = signatures[0]
    by_index = {d["index"]: name for name, d in runner.signature_details(key)[0].items()}
    return key, [by_index[d["index"]] for d in runner.input_details()]
