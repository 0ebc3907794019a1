"""One backend seam (runtime/backend.py): `Runner` is the only interface edgekit runs models through, its
interpreter implementation gives the bare interpreter's numbers, and another Runner plugs in behind Model."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from conftest import ROOT

# methods only a LiteRT / TFLite Interpreter or SignatureRunner has (`invoke` is left out: Runner has one too)
INTERPRETER_METHODS = {"set_tensor", "get_tensor", "tensor", "get_signature_runner", "get_signature_list",
                       "allocate_tensors", "resize_tensor_input", "get_input_details", "get_output_details",
                       "get_tensor_details"}
INTERPRETER_MODULES = ("ai_edge_litert.interpreter", "tflite_runtime.interpreter", "tensorflow.lite")


def _calls_the_interpreter(tree: ast.AST) -> bool:
    """Calls an interpreter-only method, imports an Interpreter, or builds one through `tf.lite.Interpreter`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in INTERPRETER_METHODS | {"interpreter_class"}:
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "") in INTERPRETER_MODULES and \
                any(a.name in ("Interpreter", "SignatureRunner") for a in node.names):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Interpreter" and \
                isinstance(node.value, ast.Attribute) and node.value.attr == "lite":
            return True
    return False


def interpreter_modules() -> list[str]:
    return sorted(str(path.relative_to(ROOT)) for folder in ("edgekit", "converters", "runtime")
                  for path in (ROOT / folder).rglob("*.py") if _calls_the_interpreter(ast.parse(path.read_text())))


def test_the_scan_finds_interpreter_calls():
    assert _calls_the_interpreter(ast.parse("interp.get_tensor(3)"))
    assert _calls_the_interpreter(ast.parse("from ai_edge_litert.interpreter import Interpreter"))
    assert _calls_the_interpreter(ast.parse("tf.lite.Interpreter(model_content=b'')"))
    assert not _calls_the_interpreter(ast.parse("runner.get(3); runner.invoke(); runner.set(0, x)"))


def test_at_most_three_modules_call_the_interpreter():
    found = interpreter_modules()
    assert "runtime/backend.py" in found  # the seam itself: the scan sees it
    assert len(found) <= 3, f"modules calling interpreter methods: {found}; go through runtime.backend.Runner"


def _inputs(model, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, i.shape).astype(i.dtype) if np.issubdtype(i.dtype, np.integer)
            else rng.uniform(0, 255, i.shape).astype(i.dtype) for i in model.inputs]


@pytest.mark.parametrize("mode", ["float32", "int8"])
def test_a_runner_gives_the_bare_interpreters_outputs(converted, mode):
    from edgekit.runtime import Model
    from edgekit.runtime.backend import get_backend

    path = converted(mode)
    model = Model(path, num_threads=1)
    bare = get_backend().interpreter(model_content=path.read_bytes(), num_threads=1)
    runner = model.runner
    assert [d["index"] for d in runner.input_details()] == [d["index"] for d in bare.get_input_details()]
    assert [d["index"] for d in runner.output_details()] == [d["index"] for d in bare.get_output_details()]
    for seed in range(3):
        xs = _inputs(model, seed)
        for d, x in zip(bare.get_input_details(), xs):
            bare.set_tensor(d["index"], x)
        bare.invoke()
        want = [bare.get_tensor(d["index"]) for d in bare.get_output_details()]
        got = model.invoke_raw(xs)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)
        view = runner.view(model.outputs[0].index)  # zero-copy: the runner's own buffer
        np.testing.assert_array_equal(view, want[0])
        assert not view.flags.owndata
        del view  # LiteRT refuses to invoke while a view is alive


def test_a_debugging_runner_keeps_every_intermediate_tensor(converted, digits_dir):
    from edgekit.converters.feeding import debugging_interpreter, feeder
    from edgekit.runtime.backend import get_backend

    tflite = converted("float32").read_bytes()
    shape = get_backend().interpreter(model_content=tflite, num_threads=None).get_input_details()[0]["shape"]
    sample = [np.random.default_rng(0).uniform(0, 255, shape).astype(np.float32)]
    runner = debugging_interpreter(tflite, sample)
    feeder(runner)(sample)
    bare = get_backend().interpreter(model_content=tflite, num_threads=None, preserve_all_tensors=True)
    bare.set_tensor(bare.get_input_details()[0]["index"], sample[0])
    bare.invoke()
    checked = 0
    for d in bare.get_tensor_details():
        if d["dtype"] != np.float32:  # int32 scratch and shape tensors hold whatever memory held
            continue
        try:
            want = bare.get_tensor(d["index"])
        except ValueError:  # a tensor without data (an optional operand)
            continue
        np.testing.assert_array_equal(runner.get(d["index"]), want)
        checked += 1
    assert checked > len(runner.input_details()) + len(runner.output_details())


def test_another_runner_plugs_in_behind_model(converted, monkeypatch):
    """A second Runner (here one that counts invokes around the interpreter's) serves Model unchanged: Model
    reaches the backend only through `Backend.runner`."""
    from dataclasses import dataclass

    import edgekit.runtime.model as model_module
    from edgekit.runtime import Model
    from edgekit.runtime.backend import Backend, InterpreterRunner, Runner, get_backend

    class Counting(InterpreterRunner):
        invokes = 0

        def __init__(self, interpreter):
            super().__init__(interpreter)
            inner = self.invoke

            def invoke() -> None:
                Counting.invokes += 1
                inner()

            self.invoke = invoke

    @dataclass(frozen=True)
    class CountingBackend(Backend):
        def runner(self, **kwargs) -> Runner:
            return Counting(self.interpreter(**kwargs))

    path = converted("int8")
    x = np.random.default_rng(0).uniform(0, 255, (5, *Model(path).inputs[0].shape[1:])).astype(np.float32)
    want = Model(path, num_threads=1).predict(x)
    real = get_backend()
    monkeypatch.setattr(model_module, "get_backend", lambda name=None: CountingBackend(
        real.name, real.version, real.interpreter_class, real.load_delegate, real.op_resolver_type))
    model = Model(path, num_threads=1, probe=False)
    assert isinstance(model.runner, Counting)
    np.testing.assert_array_equal(model.predict(x), want)
    assert Counting.invokes == 5
