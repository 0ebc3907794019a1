#!/usr/bin/env python3
"""Every model's raw outputs on the bundled digits, one invoke per image, for comparing platforms:

    python arm_outputs.py MODELS_DIR DIGITS_TEST_DIR OUT.npz

Runs with any Python that has edgekit's runtime (the x86 venv, an arm64 or armhf root): each `.tflite` in
MODELS_DIR is loaded on one thread, every image is encoded through the model's own preprocessing and
invoked alone; OUT.npz holds, per model and output, the stacked raw outputs (`MODEL/OUTPUT`) and the
model's mode (`MODEL/@mode`), or why this interpreter cannot load it (`MODEL/@error`: tflite-runtime 2.14
lacks newer op versions). The first run encodes the images and keeps them in MODELS_DIR/inputs.npz; every
later run (the other x86 backend, each ARM root) feeds those same arrays, so the outputs compare the
interpreters, not two platforms' OpenCV (an arm64 root's opencv 5.1 resized the 8x8 digits to the
detector's 64x64x3 a level apart from x86's 5.0 in places, enough to reorder its near-tied detections). A detection post-processing op's boxes, classes and scores past its count are
unspecified (armv7's tflite-runtime leaves other values there than x86's): they are written as 0. Called by
.ci/arm.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np


def main(models: Path, test: Path, out: Path) -> None:
    from edgekit.errors import ModelFormatError
    from edgekit.runtime import Model, image_files, read_image
    from edgekit.runtime.tasks import RawTask

    images = [read_image(p) for p in image_files(test)]
    kept = models / "inputs.npz"
    encoded = dict(np.load(kept)) if kept.is_file() else {}
    arrays: dict[str, np.ndarray] = {}
    for path in sorted(models.glob("*.tflite")):
        try:
            model = Model(path, num_threads=1)
        except ModelFormatError as exc:
            arrays[f"{path.name}/@error"] = np.array(str(exc))
            continue
        if path.name not in encoded:
            task = RawTask(model)
            encoded[path.name] = np.stack([task.encode_image(image) for image in images])
        rows = [_defined(model, model.invoke_one(x)) for x in encoded[path.name]]
        for i, info in enumerate(model.outputs):
            arrays[f"{path.name}/{info.name}"] = np.concatenate([r[i] for r in rows])
        arrays[f"{path.name}/@mode"] = np.array((model.metadata or {}).get("mode") or "float32")
    np.savez(out, **arrays)
    if not kept.is_file():
        np.savez(kept, **encoded)
    print(f"{len(images)} images through {len(list(models.glob('*.tflite')))} models -> {out}")


def _defined(model, outputs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs with what TFLite_Detection_PostProcess leaves unspecified (past its count) set to 0."""
    from edgekit.runtime.metadata import read_custom_op_outputs

    where = {info.index: i for i, info in enumerate(model.outputs)}
    for group in read_custom_op_outputs(model.view, "TFLite_Detection_PostProcess"):
        if len(group) != 4 or not all(t in where for t in group):
            continue
        *per_detection, count = (where[t] for t in group)
        n = int(round(float(outputs[count].reshape(-1)[0])))
        for i in per_detection:
            outputs[i] = outputs[i].copy()
            outputs[i][:, n:] = 0
    return outputs


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
