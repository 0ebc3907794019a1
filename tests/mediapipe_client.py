"""MediaPipe Tasks as the client of a .tflite, run in a Python that has mediapipe (its own venv: mediapipe
pins absl-py against tensorflow-model-optimization, so it cannot share edgekit[convert]'s):

    python mediapipe_client.py JOB.json     # prints one JSON object

A job is {"task": "classify" | "segment" | "audio" | "detect", "model": PATH, "inputs": [PATH ...],
...}: images are .npy arrays (H, W, 3) uint8 RGB, audio a .npy of float32 samples with "sample_rate".
"""

from __future__ import annotations

import json
import sys

import numpy as np


def _image(path: str):
    import mediapipe as mp

    return mp.Image(image_format=mp.ImageFormat.SRGB, data=np.ascontiguousarray(np.load(path), np.uint8))


def classify(job: dict) -> list:
    from mediapipe.tasks.python import BaseOptions
    from mediapipe.tasks.python.vision import ImageClassifier, ImageClassifierOptions

    options = ImageClassifierOptions(base_options=BaseOptions(model_asset_path=job["model"]), max_results=1)
    out = []
    with ImageClassifier.create_from_options(options) as classifier:
        for path in job["inputs"]:
            best = classifier.classify(_image(path)).classifications[0].categories[0]
            out.append({"index": best.index, "score": best.score, "name": best.category_name})
    return out


def segment(job: dict) -> list:
    from mediapipe.tasks.python import BaseOptions
    from mediapipe.tasks.python.vision import ImageSegmenter, ImageSegmenterOptions

    options = ImageSegmenterOptions(base_options=BaseOptions(model_asset_path=job["model"]),
                                    output_confidence_masks=True, output_category_mask=True)
    out = []
    with ImageSegmenter.create_from_options(options) as segmenter:
        labels = list(segmenter.labels)
        for path in job["inputs"]:
            result = segmenter.segment(_image(path))
            masks = [m.numpy_view().tolist() for m in result.confidence_masks]
            out.append({"confidence": masks, "category": result.category_mask.numpy_view().tolist(),
                        "labels": labels})
    return out


def audio(job: dict) -> list:
    from mediapipe.tasks.python import BaseOptions
    from mediapipe.tasks.python.audio import AudioClassifier, AudioClassifierOptions
    from mediapipe.tasks.python.components.containers import AudioData

    options = AudioClassifierOptions(base_options=BaseOptions(model_asset_path=job["model"]), max_results=1)
    out = []
    with AudioClassifier.create_from_options(options) as classifier:
        for path in job["inputs"]:
            samples = np.load(path).astype(np.float32)
            data = AudioData.create_from_array(samples, job["sample_rate"])
            result = classifier.classify(data)[0]
            best = result.classifications[0].categories[0]
            out.append({"index": best.index, "score": best.score, "name": best.category_name})
    return out


def detect(job: dict) -> list:
    from mediapipe.tasks.python import BaseOptions
    from mediapipe.tasks.python.vision import ObjectDetector, ObjectDetectorOptions

    options = ObjectDetectorOptions(base_options=BaseOptions(model_asset_path=job["model"]),
                                    score_threshold=job.get("threshold", 0.0), max_results=-1)
    out = []
    with ObjectDetector.create_from_options(options) as detector:
        for path in job["inputs"]:
            found = []
            for d in detector.detect(_image(path)).detections:
                b, best = d.bounding_box, d.categories[0]
                found.append({"box": [b.origin_y, b.origin_x, b.origin_y + b.height, b.origin_x + b.width],
                              "index": best.index, "score": best.score, "name": best.category_name})
            out.append(found)
    return out


if __name__ == "__main__":
    job = json.load(open(sys.argv[1]))
    try:
        result = {"ok": True, "results": globals()[job["task"]](job)}
    except Exception as exc:  # what MediaPipe says about the file is the test's evidence
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
