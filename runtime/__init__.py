"""edgekit.runtime: TensorFlow-free inference for .tflite models (numpy + LiteRT, OpenCV for images).

    from edgekit.runtime import Classifier, open_source
    clf = Classifier("digits.int8.tflite", num_threads=4)
    with open_source(0) as frames:                  # camera 0, a video, an image, a folder, a glob
        for frame in frames:
            print(clf.classify(frame.image, top_k=3))
"""

import importlib
import importlib.util

_WHERE = {
    "Backend": "edgekit.runtime.backend",
    "Camera": "edgekit.runtime.sources",
    "Classification": "edgekit.runtime.tasks",
    "Classifier": "edgekit.runtime.tasks",
    "Detection": "edgekit.runtime.tasks",
    "Detector": "edgekit.runtime.tasks",
    "Frame": "edgekit.runtime.sources",
    "ImageFiles": "edgekit.runtime.sources",
    "ImageFolder": "edgekit.runtime.datasets",
    "InputEncoder": "edgekit.runtime.preprocess",
    "Model": "edgekit.runtime.model",
    "PreprocessSpec": "edgekit.runtime.preprocess",
    "RawTask": "edgekit.runtime.tasks",
    "Runner": "edgekit.runtime.backend",
    "Source": "edgekit.runtime.sources",
    "TensorInfo": "edgekit.runtime.model",
    "VideoFile": "edgekit.runtime.sources",
    "dequantize": "edgekit.runtime.quant",
    "get_backend": "edgekit.runtime.backend",
    "image_files": "edgekit.runtime.datasets",
    "load_and_prepare": "edgekit.runtime.preprocess",
    "open_source": "edgekit.runtime.sources",
    "prepare": "edgekit.runtime.preprocess",
    "quantize": "edgekit.runtime.quant",
    "read_edgekit_metadata": "edgekit.runtime.metadata",
    "read_image": "edgekit.runtime.preprocess",
    "read_metadata_entries": "edgekit.runtime.metadata",
    "task_for": "edgekit.runtime.tasks",
}

__all__ = [
    "Backend", "Camera", "Classification", "Classifier", "Detection", "Detector", "Frame", "ImageFiles",
    "ImageFolder", "InputEncoder", "Model", "PreprocessSpec", "RawTask", "Runner", "Source", "TensorInfo", "VideoFile",
    "dequantize", "get_backend", "image_files", "load_and_prepare", "open_source", "prepare", "quantize",
    "read_edgekit_metadata", "read_image", "read_metadata_entries", "task_for",
]


def __getattr__(name: str):
    """Names imported on first use: `import edgekit.runtime.delegates` does not load the interpreter."""
    module = _WHERE.get(name)
    if module is None:  # a submodule not imported yet (edgekit.runtime.probe after `import edgekit.runtime`)
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module 'edgekit.runtime' has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
