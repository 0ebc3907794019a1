"""edgekit.runtime: TensorFlow-free inference for .tflite models (numpy + LiteRT, OpenCV for images).

    from edgekit.runtime import Classifier, open_source
    clf = Classifier("digits.int8.tflite", num_threads=4)
    with open_source(0) as frames:                  # camera 0, a video, an image, a folder, a glob
        for frame in frames:
            print(clf.classify(frame.image, top_k=3))
"""

from edgekit.runtime.backend import Backend, get_backend
from edgekit.runtime.datasets import ImageFolder, image_files
from edgekit.runtime.metadata import read_edgekit_metadata, read_metadata_entries
from edgekit.runtime.model import Model, TensorInfo
from edgekit.runtime.preprocess import InputEncoder, PreprocessSpec, load_and_prepare, prepare, read_image
from edgekit.runtime.quant import dequantize, quantize
from edgekit.runtime.sources import Camera, Frame, ImageFiles, Source, VideoFile, open_source
from edgekit.runtime.tasks import Classification, Classifier, Detection, Detector, RawTask, task_for

__all__ = [
    "Backend", "Camera", "Classification", "Classifier", "Detection", "Detector", "Frame", "ImageFiles",
    "ImageFolder", "InputEncoder", "Model", "PreprocessSpec", "RawTask", "Source", "TensorInfo", "VideoFile",
    "dequantize", "get_backend", "image_files", "load_and_prepare", "open_source", "prepare", "quantize",
    "read_edgekit_metadata", "read_image", "read_metadata_entries", "task_for",
]
