"""edgekit.runtime: TensorFlow-free inference for .tflite models (numpy + LiteRT, OpenCV for images)."""

from edgekit.runtime.backend import Backend, get_backend
from edgekit.runtime.datasets import ImageFolder
from edgekit.runtime.metadata import read_edgekit_metadata, read_metadata_entries
from edgekit.runtime.model import Model, TensorInfo, dequantize, quantize
from edgekit.runtime.preprocess import PreprocessSpec, load_and_prepare, prepare, read_image

__all__ = [
    "Backend", "ImageFolder", "Model", "PreprocessSpec", "TensorInfo", "dequantize", "get_backend",
    "load_and_prepare", "prepare", "quantize", "read_edgekit_metadata", "read_image",
    "read_metadata_entries",
]
