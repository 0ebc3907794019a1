"""The standard TFLite Metadata of a converted model (runtime/tflite_metadata.py writes it): the model's name,
version, description, author and licence; per input its content (image: colour space, and for float
inputs the normalisation edgekit's preprocessing applies; audio: sample rate and channels) and value
range; per output its content, its labels as an associated file (TENSOR_AXIS_LABELS), and for a detector
the four outputs MediaPipe's ObjectDetector matches by name, with their box layout and group. What a
reader of the standard cannot do with the file (MediaPipe: one normalisation value for all channels,
three-channel images, no int8 tensors) comes back as notes (ConvertResult.notes, `convert -v`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit._version import __version__
from edgekit.converters.recipe import ConvertRecipe
from edgekit.runtime.flatbuffer import NUMPY_TYPES, ModelView
from edgekit.runtime.metadata import read_custom_op_outputs
from edgekit.runtime.preprocess import PreprocessSpec

DETECTION_OP = "TFLite_Detection_PostProcess"
DETECTION_NAMES = ("location", "category", "score", "number of detections")  # what MediaPipe matches
LABELS_FILE = "labels.txt"


def standard_metadata(recipe: ConvertRecipe, tflite: bytes, specs: dict[str, PreprocessSpec | None],
                      labels: list[str], names: dict[int, str],
                      mode: str | None = None) -> tuple[dict[str, Any], dict[str, bytes], list[str]]:
    """(ModelMetadata, associated files by name, notes for MediaPipe users) for a converted model. `specs`:
    each input's preprocessing by name; `names`: tensor index -> the name edgekit gives that input or output;
    `mode`: the file's where it is not the recipe's (the budget handed back float16 or dynamic)."""
    view = ModelView(tflite)
    sub = view.first_subgraph()
    tensors = sub.tensors
    warnings: list[str] = []
    detection = next(iter(read_custom_op_outputs(view, DETECTION_OP)), None)
    files = {LABELS_FILE: ("\n".join(labels) + "\n").encode("utf-8")} if labels else {}
    inputs = [_input(tensors[i], names.get(i, tensors[i].name), specs.get(names.get(i, "")), recipe, warnings)
              for i in sub.inputs]
    outputs = [_output(tensors[i], names.get(i, tensors[i].name), labels, detection, k, len(sub.outputs))
               for k, i in enumerate(sub.outputs)]
    subgraph: dict[str, Any] = {"name": "main", "input_tensor_metadata": inputs, "output_tensor_metadata": outputs}
    if detection is not None and len(detection) == 4:
        subgraph["output_tensor_groups"] = [{"name": "detection_result", "tensor_names": list(DETECTION_NAMES[:3])}]
    if any(tensors[i].type_name == "INT8" for i in (*sub.inputs, *sub.outputs)):
        warnings.append("MediaPipe Tasks read uint8 or float32 inputs and outputs, not int8: for MediaPipe, "
                        "convert with `io=uint8` or `io=float32`")
    info = recipe.info
    stem = recipe.model.name.rsplit(".", 1)[0] if "." in recipe.model.name else recipe.model.name
    meta = {"name": info.name or stem,
            "description": info.description or f"{stem}, converted to {mode or recipe.mode} by edgekit {__version__}",
            "version": info.version, "author": info.author, "license": info.license,
            "subgraph_metadata": [subgraph], "min_parser_version": _parser_version(subgraph)}
    return {k: v for k, v in meta.items() if v is not None}, files, warnings


def _input(tensor, name: str, spec: PreprocessSpec | None, recipe: ConvertRecipe, warnings: list[str]) -> dict:
    entry: dict[str, Any] = {"name": name}
    floating = tensor.type_name in ("FLOAT32", "FLOAT16")
    if spec is not None:
        entry["content"] = {"content_properties": {"$type": "ImageProperties",
                                                   "color_space": "GRAYSCALE" if spec.channels == 1 else "RGB"}}
        if floating:  # integer inputs take raw pixels: their quantization is their normalisation
            entry["process_units"] = [{"options": {"$type": "NormalizationOptions", "mean": list(spec.mean),
                                                   "std": list(spec.std)}}]
            lo = [(0.0 - m) / s for m, s in zip(spec.mean, spec.std)]
            hi = [(255.0 - m) / s for m, s in zip(spec.mean, spec.std)]
            entry["stats"] = {"min": [min(a, b) for a, b in zip(lo, hi)], "max": [max(a, b) for a, b in zip(lo, hi)]}
            if len(set(spec.mean)) > 1 or len(set(spec.std)) > 1:
                warnings.append(f"input {name!r}: per-channel mean/std are written to the TFLite Metadata, but "
                                "MediaPipe applies one value for all channels and refuses the file (other "
                                "readers apply them)")
        if spec.channels == 1:
            warnings.append(f"input {name!r} is grayscale: MediaPipe's image tasks take 3-channel images only "
                            "(other TFLite Metadata readers take it)")
        return entry
    if recipe.info.sample_rate is not None and floating and len(tensor.shape) in (1, 2):
        channels = int(tensor.shape[-1]) if len(tensor.shape) == 2 and tensor.shape[0] > 1 else 1
        entry["content"] = {"content_properties": {"$type": "AudioProperties",
                                                   "sample_rate": int(recipe.info.sample_rate), "channels": channels}}
        return entry
    entry["content"] = {"content_properties": {"$type": "FeatureProperties"}}
    kind = NUMPY_TYPES.get(tensor.type_name or "")
    quantized = tensor.quantization is not None and len(tensor.quantization.scales) > 0
    if kind is not None and issubclass(kind, np.integer) and not quantized:
        info = np.iinfo(kind)
        entry["content"]["range"] = {"min": max(int(info.min), -2**31), "max": min(int(info.max), 2**31 - 1)}
    return entry


def _output(tensor, name: str, labels: list[str], detection: list[int] | None, position: int, count: int) -> dict:
    if detection is not None and len(detection) == 4 and tensor.index in detection:
        role = detection.index(tensor.index)
        entry: dict[str, Any] = {"name": DETECTION_NAMES[role], "description": f"{name} (edgekit)"}
        if role == 0:  # [1, N, 4]: ymin, xmin, ymax, xmax as fractions of the image
            entry["content"] = {"content_properties": {"$type": "BoundingBoxProperties", "index": [1, 0, 3, 2],
                                                       "type": "BOUNDARIES", "coordinate_type": "RATIO"}}
        else:
            entry["content"] = {"content_properties": {"$type": "FeatureProperties"}}
        if role == 1 and labels:
            entry["associated_files"] = [{"name": LABELS_FILE, "description": "class names",
                                          "type": "TENSOR_VALUE_LABELS"}]
        return entry
    entry = {"name": name}
    shape = tuple(int(d) for d in tensor.shape)
    dense = len(shape) == 4 and shape[1] > 1 and shape[2] > 1  # a mask or a heatmap: one value per pixel
    entry["content"] = {"content_properties": {"$type": "ImageProperties", "color_space": "GRAYSCALE"}} if dense \
        else {"content_properties": {"$type": "FeatureProperties"}}
    per_class = shape[-1] if shape else 0
    if labels and per_class == len(labels) and (not dense or position == count - 1):
        entry["associated_files"] = [{"name": LABELS_FILE, "description": "class names",
                                      "type": "TENSOR_AXIS_LABELS"}]
    return entry


def _parser_version(subgraph: dict[str, Any]) -> str:
    """The least metadata parser version that reads these features (metadata_version.cc's table): tensor
    groups 1.2.0, AudioProperties 1.3.0, else 1.0.0."""
    audio = any((t.get("content") or {}).get("content_properties", {}).get("$type") == "AudioProperties"
                for t in subgraph["input_tensor_metadata"])
    if audio:
        return "1.3.0"
    return "1.2.0" if subgraph.get("output_tensor_groups") else "1.0.0"
