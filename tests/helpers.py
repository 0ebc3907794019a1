"""Test helpers: run the CLI in a fresh interpreter, optionally with TensorFlow made unimportable."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

BLOCK_TF = """
import sys, importlib.abc
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('tensorflow', 'keras', 'tf_keras', 'tensorflow_model_optimization'):
            raise ImportError(f'No module named {name!r} (blocked by the test)')
        return None
sys.meta_path.insert(0, _Block())
"""

RUN_CLI = """
import sys
from edgekit.cli import main
try:
    main(sys.argv[1:], prog_name='edgekit')
finally:
    loaded = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)
    sys.stderr.write('\\n@@modules ' + ','.join(loaded) + '\\n')
"""


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    modules: list[str]

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def run_cli(*args: str, block_tf: bool = False, cwd=None, timeout: float = 600) -> CliResult:
    """`edgekit ARGS` in a subprocess; reports which of tensorflow/keras got imported."""
    code = (BLOCK_TF if block_tf else "") + RUN_CLI
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("EDGEKIT_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)
    stderr, _, tail = proc.stderr.rpartition("@@modules ")
    modules = [m for m in tail.strip().split(",") if m]
    return CliResult(proc.returncode, proc.stdout, stderr, modules)
