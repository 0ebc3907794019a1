"""`edgekit bench --on` adds nothing inside the timed loop: p50 measured on the loopback "device" (a
private sshd on 127.0.0.1, tests/sshd.py) against a local `edgekit bench` of the same model, interleaved
in one run. Run with `python -m pytest -m perf -s tests/perf/test_remote_bench.py`."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from sshd import LoopbackSSHD

pytestmark = pytest.mark.perf

ROUNDS = 5
RUNS = ["--runs", "400", "--warmup", "40", "--threads", "1"]


def _p50(cmd, env=None) -> tuple[float, float]:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, timeout=300).stdout
    lat = json.loads(out)["models"][0]["latency_ms"]
    return lat["p50"], lat["p90"]


@pytest.mark.parametrize("mode", ["float32", "int8"])
def test_remote_p50_is_within_the_local_spread(converted, tmp_path, mode):
    model = str(converted(mode))
    local_cmd = [sys.executable, "-m", "edgekit", "bench", model, *RUNS, "--json", "-"]
    remote_cmd = [*local_cmd, "--on", "devA", "--remote-python", sys.executable]
    local, remote = [], []
    with LoopbackSSHD(tmp_path) as sshd:
        for _ in range(ROUNDS):  # interleaved: the machine's drift hits both alike
            local.append(_p50(local_cmd))
            remote.append(_p50(remote_cmd, env=sshd.env))
    lo = min(p50 for p50, _ in local)
    hi = max(p90 for _, p90 in local)
    med_local = statistics.median(p50 for p50, _ in local)
    med_remote = statistics.median(p50 for p50, _ in remote)
    print(f"\n{mode}: local p50 {[round(p, 4) for p, _ in local]} ms, remote p50 {[round(p, 4) for p, _ in remote]} ms;"
          f" median remote/local {med_remote / med_local:.3f}; local spread [{lo:.4f}, {hi:.4f}] ms (min p50, max p90)")
    assert lo <= med_remote <= hi
