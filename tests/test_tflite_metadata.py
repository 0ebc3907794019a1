"""The standard TFLite Metadata codec (runtime/tflite_metadata.py): what it writes is what the schema's own
generated module reads (MediaPipe's copy, in the MediaPipe venv), it reads back what it wrote, and a
hostile metadata buffer or zip is a warning, never a crash, a hang or unbounded memory. No TensorFlow."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import zipfile

import numpy as np
import pytest
from edgekit.runtime.model import Model
from edgekit.runtime.tflite_metadata import (
    associated_files,
    decode,
    encode,
    flatbuffer_end,
    with_metadata,
)
from test_mediapipe import mediapipe_python  # noqa: F401 - the fixture
from tflite_build import Tensor, one_op

from edgekit.errors import ModelFormatError

SAMPLE = {
    "name": "digits", "description": "a test", "version": "1", "author": "me", "license": "Apache-2.0",
    "min_parser_version": "1.3.0",
    "subgraph_metadata": [{
        "name": "main",
        "input_tensor_metadata": [
            {"name": "image", "content": {"content_properties": {"$type": "ImageProperties", "color_space": "RGB"},
                                          "range": {"min": 0, "max": 255}},
             "process_units": [{"options": {"$type": "NormalizationOptions", "mean": [127.5], "std": [127.5]}}],
             "stats": {"max": [1.0], "min": [-1.0]}},
            {"name": "audio", "content": {"content_properties": {"$type": "AudioProperties", "sample_rate": 16000,
                                                                 "channels": 1}}}],
        "output_tensor_metadata": [
            {"name": "probs", "content": {"content_properties": {"$type": "FeatureProperties"}},
             "associated_files": [{"name": "labels.txt", "type": "TENSOR_AXIS_LABELS", "description": "labels"}]},
            {"name": "location", "content": {"content_properties": {
                "$type": "BoundingBoxProperties", "index": [1, 0, 3, 2], "type": "BOUNDARIES",
                "coordinate_type": "RATIO"}}}],
        "output_tensor_groups": [{"name": "detection_result", "tensor_names": ["location", "category", "score"]}],
    }],
}

DUMP = """
import importlib.util, json, sys, pathlib
import mediapipe
path = pathlib.Path(mediapipe.__file__).parent / "tasks" / "metadata" / "metadata_schema_py_generated.py"
spec = importlib.util.spec_from_file_location("schema", path)
s = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s)
m = s.ModelMetadataT.InitFromObj(s.ModelMetadata.GetRootAs(open(sys.argv[1], "rb").read(), 0))
def plain(o):
    if isinstance(o, bytes):
        return o.decode()
    if isinstance(o, (list, tuple)):
        return [plain(x) for x in o]
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dict__"):
        return {k: plain(v) for k, v in vars(o).items() if v is not None}
    return o
print(json.dumps(plain(m)))
"""


def test_the_schemas_own_generated_module_reads_what_edgekit_writes(mediapipe_python, tmp_path):  # noqa: F811
    path = tmp_path / "meta.bin"
    path.write_bytes(encode(SAMPLE))
    proc = subprocess.run([mediapipe_python, "-c", DUMP, str(path)], capture_output=True, text=True, timeout=300)
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert theirs["name"] == "digits" and theirs["minParserVersion"] == "1.3.0" and theirs["author"] == "me"
    sub = theirs["subgraphMetadata"][0]
    image, audio = sub["inputTensorMetadata"]
    assert image["content"]["contentPropertiesType"] == 2 and image["content"]["contentProperties"]["colorSpace"] == 1
    assert image["content"]["range"] == {"min": 0, "max": 255}
    assert image["processUnits"][0]["optionsType"] == 1
    assert image["processUnits"][0]["options"] == {"mean": [127.5], "std": [127.5]}
    assert image["stats"] == {"max": [1.0], "min": [-1.0]}
    assert audio["content"]["contentPropertiesType"] == 4
    assert audio["content"]["contentProperties"] == {"sampleRate": 16000, "channels": 1}
    probs, location = sub["outputTensorMetadata"]
    assert probs["associatedFiles"][0] == {"name": "labels.txt", "description": "labels", "type": 2}
    assert location["content"]["contentProperties"] == {"index": [1, 0, 3, 2], "type": 1, "coordinateType": 0}
    assert sub["outputTensorGroups"][0] == {"name": "detection_result",
                                            "tensorNames": ["location", "category", "score"]}


def test_what_is_written_reads_back_the_same():
    assert decode(encode(SAMPLE)) == SAMPLE


def test_every_truncation_and_byte_flip_of_a_metadata_buffer_is_a_model_format_error_or_a_value():
    data = encode(SAMPLE)
    rng = np.random.default_rng(0)
    cases = [data[:n] for n in range(0, len(data))]
    for _ in range(2000):
        bad = bytearray(data)
        for at in rng.integers(8, len(data), rng.integers(1, 4)):
            bad[at] = rng.integers(0, 256)
        cases.append(bytes(bad))
    refused = 0
    for case in cases:
        try:
            assert isinstance(decode(case), dict)
        except ModelFormatError:
            refused += 1
    assert refused >= len(data) // 2  # most truncations cannot be read, and say so


def _relu() -> bytes:
    return one_op("RELU", [Tensor((1, 4, 4, 3))], [Tensor((1, 4, 4, 3))])


def test_labels_travel_in_an_uncompressed_zip_after_the_flatbuffer():
    model = with_metadata(_relu(), SAMPLE, {"labels.txt": b"cat\ndog\n"})
    assert flatbuffer_end(model) < len(model)
    with zipfile.ZipFile(io.BytesIO(model)) as zf:
        assert [(i.filename, i.compress_type) for i in zf.infolist()] == [("labels.txt", zipfile.ZIP_STORED)]
    assert associated_files(model, {"labels.txt"}) == {"labels.txt": b"cat\ndog\n"}
    again = with_metadata(model, SAMPLE, {"labels.txt": b"bird\n"})  # replaced, not stacked
    assert associated_files(again, {"labels.txt"}) == {"labels.txt": b"bird\n"}
    assert len(again) < len(model) + 200


def test_a_compressed_or_oversized_associated_file_is_not_read(monkeypatch):
    from edgekit.runtime import tflite_metadata

    out = io.BytesIO()
    out.write(_relu())
    with zipfile.ZipFile(out, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("labels.txt", b"a\n" * 10**6)  # 2 MB that deflate to kilobytes
    assert associated_files(out.getvalue(), {"labels.txt"}) == {}
    monkeypatch.setattr(tflite_metadata, "MAX_ASSOCIATED_BYTES", 4)
    model = with_metadata(_relu(), SAMPLE, {"labels.txt": b"cat\ndog\n"})
    assert associated_files(model, {"labels.txt"}) == {}


def test_a_model_whose_standard_metadata_does_not_decode_warns_and_runs(caplog):
    model = with_metadata(_relu(), SAMPLE, {})
    at = model.index(b"M001")
    broken = model[:at - 4] + b"\xff\xff\xff\x7f" + model[at:]  # the metadata's root offset, far past its end
    with caplog.at_level(logging.WARNING, logger="edgekit"):
        m = Model(broken, probe=False)
    assert m.tflite_metadata is None
    assert any("TFLite metadata: corrupt flatbuffer" in r.getMessage() for r in caplog.records)
    assert m.invoke_raw([np.ones((1, 4, 4, 3), np.float32)])[0].shape == (1, 4, 4, 3)


def test_a_third_party_files_normalisation_and_labels_are_used_and_said():
    meta = {"subgraph_metadata": [{"input_tensor_metadata": [
        {"name": "image", "content": {"content_properties": {"$type": "ImageProperties", "color_space": "RGB"}},
         "process_units": [{"options": {"$type": "NormalizationOptions", "mean": [0.0], "std": [255.0]}}]}],
        "output_tensor_metadata": [{"name": "out", "associated_files": [
            {"name": "labels.txt", "type": "TENSOR_AXIS_LABELS"}]}]}]}
    model = Model(with_metadata(_relu(), meta, {"labels.txt": b"a\nb\nc\n"}), probe=False)
    assert model.preprocess_source == "TFLite metadata"
    assert (model.preprocess.mean, model.preprocess.std) == ((0.0,), (255.0,))
    assert model.labels == ("a", "b", "c")


def test_a_float_image_input_with_no_preprocessing_anywhere_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="edgekit"):
        model = Model(_relu(), probe=False)
        assert model.preprocess_source == "input-shape defaults"
        model.preprocessing_of(model.inputs[0])  # what bench and the tasks ask before their checks: silent
        assert not [r for r in caplog.records if "no preprocessing stored" in r.getMessage()]
        model.preprocess  # the public spec (docs/python.md feeds it to prepare()): said
        model.say_preprocessing(model.inputs[0])
    said = [r.getMessage() for r in caplog.records if "no preprocessing stored" in r.getMessage()]
    assert len(said) == 1  # once per model


def _shared_tables(fan: int) -> bytes:
    """An M001 buffer of a few kilobytes whose subgraph_metadata lists one subgraph `fan` times, and that one
    lists one tensor `fan` times: fan**2 tables by offset."""
    import flatbuffers
    from edgekit.runtime.tflite_metadata import _slots

    fid = {t: {name: f for name, _, f in _slots(t)} for t in ("ModelMetadata", "SubGraphMetadata", "TensorMetadata")}
    b = flatbuffers.Builder(1024)
    name = b.CreateString("x" * 64)
    b.StartObject(len(_slots("TensorMetadata")) + 4)
    b.PrependUOffsetTRelativeSlot(fid["TensorMetadata"]["name"], name, 0)
    tensor = b.EndObject()

    def shared(offset: int) -> int:
        b.StartVector(4, fan, 4)
        for _ in range(fan):
            b.PrependUOffsetTRelative(offset)
        return b.EndVector()

    tensors = shared(tensor)
    b.StartObject(len(_slots("SubGraphMetadata")) + 4)
    b.PrependUOffsetTRelativeSlot(fid["SubGraphMetadata"]["input_tensor_metadata"], tensors, 0)
    sub = b.EndObject()
    subs = shared(sub)
    b.StartObject(len(_slots("ModelMetadata")) + 4)
    b.PrependUOffsetTRelativeSlot(fid["ModelMetadata"]["subgraph_metadata"], subs, 0)
    b.Finish(b.EndObject(), b"M001")
    return bytes(b.Output())


def test_metadata_whose_vectors_share_their_tables_is_refused_in_bounded_work():
    small = decode(_shared_tables(10))  # 100 tables by offset: a value
    assert len(small["subgraph_metadata"]) == 10 and len(small["subgraph_metadata"][0]["input_tensor_metadata"]) == 10
    hostile = _shared_tables(3000)  # 9 million tables (and 576 MB of names) from 24 KB
    assert len(hostile) < 30_000
    with pytest.raises(ModelFormatError, match="corrupt"):
        decode(hostile)


def test_a_zip_directory_that_lies_is_no_zip():
    """Offsets past the end, a local header that is not one, sizes that overflow: no files, never an exception."""
    model = with_metadata(_relu(), SAMPLE, {"labels.txt": b"cat\ndog\n"})
    end = model.rfind(b"PK\x05\x06")
    central = model.rfind(b"PK\x01\x02")
    cases = {
        "offset past the end": model[:central + 42] + (2**31).to_bytes(4, "little") + model[central + 46:],
        "not a local header": model[:flatbuffer_end(model)] + b"XX" + model[flatbuffer_end(model) + 2:],
        "no members": model[:end + 8] + bytes(8) + model[end + 16:],
        "directory size overflows": model[:end + 12] + b"\xff\xff\xff\xff" + model[end + 16:],
    }
    for what, bad in cases.items():
        assert len(bad) == len(model), what
        assert associated_files(bad, {"labels.txt"}) == {}, what
        assert flatbuffer_end(bad) == len(bad), what
        Model(bad, probe=False).labels  # noqa: B018 - a model that runs, no labels


@pytest.mark.parametrize("mean, std", [([0.0], [0.0]), ([0.0, 1.0], [1.0, 1.0, 1.0, 1.0]), ([float("nan")], [1.0])])
def test_a_third_party_files_unusable_normalisation_is_warned_about_and_ignored(caplog, mean, std):
    """The file's numbers, not the caller's: not a usage error (exit 2) naming a parameter nobody passed."""
    meta = {"subgraph_metadata": [{"input_tensor_metadata": [
        {"name": "image", "process_units": [{"options": {"$type": "NormalizationOptions", "mean": mean,
                                                         "std": std}}]}]}]}
    with caplog.at_level(logging.WARNING, logger="edgekit"):
        model = Model(with_metadata(_relu(), meta, {}), probe=False)
        assert model.preprocess_source == "input-shape defaults"
        assert (model.preprocess.mean, model.preprocess.std) == ((0.0,), (1.0,))
    said = [r.getMessage() for r in caplog.records if "normalisation" in r.getMessage()]
    assert len(said) == 1 and "is ignored" in said[0], said


@pytest.mark.parametrize("kind, scale, zero_point", [("UINT8", 1 / 128, 128), ("UINT8", 1 / 255, 0),
                                                     ("INT8", 1 / 255, -128), ("INT8", 0.02, 3)])
def test_a_quantized_image_input_with_no_metadata_takes_raw_pixels_as_mediapipe_feeds_them(kind, scale, zero_point):
    """uint8: the pixel is the value; int8: pixel - 128; whatever the input's scale says they mean."""
    from edgekit.runtime.preprocess import InputEncoder

    q = Tensor((1, 4, 4, 3), kind, scales=[scale], zero_points=[zero_point])
    model = Model(one_op("RELU", [q], [Tensor((1, 4, 4, 3), kind, scales=[scale], zero_points=[zero_point])]),
                  probe=False)
    image = np.arange(48, dtype=np.uint8).reshape(4, 4, 3) * 5
    encoded = InputEncoder(model.preprocess, model.inputs[0])(image)
    expected = image.astype(np.int16) - (128 if kind == "INT8" else 0)
    assert encoded.dtype == np.dtype(kind.lower()) and np.array_equal(encoded[0].astype(np.int16), expected)


def test_a_tensor_the_metadata_does_not_list_gets_nothing_from_it():
    """-1 is what Model._position says for a tensor that is not among the subgraph's: it is not the last entry."""
    from edgekit.runtime.metadata import standard_input, standard_labels

    model = with_metadata(_relu(), SAMPLE, {"labels.txt": b"cat\ndog\n"})
    assert standard_input(SAMPLE, 0)["mean"] == (127.5,) and standard_input(SAMPLE, -1) == {}
    assert standard_labels(SAMPLE, model, 0) == ("cat", "dog") and standard_labels(SAMPLE, model, -1) == ()


@pytest.mark.parametrize("kind, count, kept", [("TENSOR_AXIS_LABELS", 3, True), ("TENSOR_AXIS_LABELS", 2, False),
                                               ("TENSOR_VALUE_LABELS", 2, True)])
def test_axis_labels_are_taken_only_where_they_name_the_outputs_last_axis(kind, count, kept):
    meta = {"subgraph_metadata": [{"output_tensor_metadata": [
        {"name": "out", "associated_files": [{"name": "labels.txt", "type": kind}]}]}]}
    names = [f"c{i}" for i in range(count)]
    model = Model(with_metadata(_relu(), meta, {"labels.txt": "\n".join(names).encode()}), probe=False)
    assert model.outputs[0].shape[-1] == 3 and model.labels == (tuple(names) if kept else ())
