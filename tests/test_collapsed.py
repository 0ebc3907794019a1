"""converters/collapsed.py: an int8 ADD output scale LiteRT's kernel aborts on is stored at the least it
takes, and the ops that pass the values through unscaled follow. The models are written with the flatbuffer
object API (no TensorFlow) and run in a child process, since the unmended ones abort it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgekit.converters.collapsed import widen_collapsed_outputs
from edgekit.runtime.flatbuffer import ModelView
from edgekit.runtime.preflight import validate
from edgekit.runtime.schema import pack, schema_module, unpack
from test_probe_cli import int8_add_model

LIMIT = 2 * 0.5 / 2**20  # the least output scale beside inputs of scale 0.5

RUN = ("import sys, json, numpy as np\nfrom ai_edge_litert.interpreter import Interpreter\n"
       "it = Interpreter(model_path=sys.argv[1]); it.allocate_tensors()\n"
       "x = np.array(json.loads(sys.argv[2]), np.int8).reshape(1, 4)\n"
       "for d in it.get_input_details(): it.set_tensor(d['index'], x)\n"
       "it.invoke(); print(json.dumps(it.get_tensor(it.get_output_details()[0]['index']).ravel().tolist()))\n")


def with_reshape(tflite: bytes) -> bytes:
    """The ADD's output then a RESHAPE [1, 4] -> [4] at the same scale (as the converter writes it)."""
    s = schema_module()
    model = unpack(tflite)
    graph = model.subgraphs[0]
    add_out = graph.tensors[2]
    out = s.TensorT()
    out.name, out.shape, out.type, out.buffer = b"flat", [4], add_out.type, len(model.buffers)
    out.quantization = s.QuantizationParametersT()
    out.quantization.scale, out.quantization.zeroPoint = list(add_out.quantization.scale), [0]
    shape = s.TensorT()
    shape.name, shape.shape, shape.type, shape.buffer = b"shape", [1], s.TensorType.INT32, len(model.buffers) + 1
    model.buffers += [s.BufferT(), s.BufferT()]
    model.buffers[-1].data = np.frombuffer(np.int32(4).tobytes(), np.uint8)
    graph.tensors += [out, shape]
    code = s.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = s.BuiltinOperator.RESHAPE
    code.version = 1
    model.operatorCodes.append(code)
    op = s.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = len(model.operatorCodes) - 1, [2, 4], [3]
    graph.operators.append(op)
    graph.outputs = [3]
    return pack(model)


def run(tmp_path, tflite: bytes, x) -> subprocess.CompletedProcess:
    path = tmp_path / "m.tflite"
    path.write_bytes(tflite)
    return subprocess.run([sys.executable, "-c", RUN, str(path), json.dumps(x)], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("factor", [0.98, 1e-3])
def test_an_add_output_scale_past_the_kernel_is_raised_to_the_least_it_takes(tmp_path, factor):
    before = with_reshape(int8_add_model(factor * LIMIT))
    assert run(tmp_path, before, [0] * 4).returncode < 0  # the premise: LiteRT aborts on it
    after, raised = widen_collapsed_outputs(before)
    validate(after)
    assert [(r["op"], r["tensor"]) for r in raised] == [("ADD", "model/quant_add/add")]
    assert LIMIT < raised[0]["to"] < LIMIT * (1 + 1e-6) and raised[0]["scale"] == pytest.approx(factor * LIMIT)
    tensors = ModelView(after).first_subgraph().tensors
    assert float(tensors[2].quantization.scales[0]) == float(tensors[3].quantization.scales[0]) == raised[0]["to"]
    # the kernel runs: 0 + 0 is 0, and any sum past the narrow range saturates, as it would have
    assert json.loads(run(tmp_path, after, [0] * 4).stdout) == [0] * 4
    assert json.loads(run(tmp_path, after, [1, -1, 3, 0]).stdout) == [127, -128, 127, 0]


def test_a_model_within_the_kernels_reach_is_returned_as_it_was():
    data = with_reshape(int8_add_model(1.02 * LIMIT))
    assert widen_collapsed_outputs(data) == (data, [])
