"""`gptq`: min/max ranges with GPTQ-rounded kernels (converters/int8/weight_rounding.py): the rounded float
weights written into the calibrated model, TFLite's quantizer after, which keeps them exactly. Made only when
asked by name (`--calib-method gptq`): `auto` does not score it yet."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.converters.int8 import weight_rounding
from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.context import Context
from edgekit.converters.int8.ranges import quantize
from edgekit.runtime.schema import with_tensor_data

MAX_SAMPLES = 200  # calibration samples the Hessians are summed over (evenly spaced): EfficientNetB0 64x64 1.3x plain


class Gptq(Candidate):
    name = "gptq"
    start_order = 6

    def __init__(self) -> None:
        self._checked: dict[str, Any] = {}

    def offered(self, ctx: Context) -> bool:
        """Not scored by `auto`: when to spend its time is the escalation rule still to come (issue 50)."""
        return False

    def make(self, ctx: Context, fit: Fit, *, view: bool, final: bool = False) -> bytes:
        """TFLite's quantizer on the calibrated model (`view`: its logits view, the same tensors) with the
        kernels GPTQ rounded on `fit`; the `final` file is checked to hold GPTQ's int8 kernels exactly."""
        data, qs = self._rounded(ctx, fit)
        made = quantize(with_tensor_data(ctx.model("", view), data), ctx.io)
        if final:
            self._checked = {"method": self.name, "layers": len(qs),
                             "differ": weight_rounding.mismatched(made, qs)}
        return made

    def basis(self, ctx: Context, fit: Fit) -> bytes | None:
        return with_tensor_data(ctx.calibrated, self._rounded(ctx, fit)[0])

    def findings(self) -> dict[str, Any]:
        return {"weight_rounding": self._checked} if self._checked else {}

    def _rounded(self, ctx: Context, fit: Fit) -> tuple[dict[int, np.ndarray], dict[str, np.ndarray]]:
        """GPTQ's kernels on (at most `MAX_SAMPLES` of) the fit's samples, once a fit."""
        def made() -> tuple[dict[int, np.ndarray], dict[str, np.ndarray]]:
            samples = fit.samples[:: max(1, len(fit.samples) // MAX_SAMPLES)][:MAX_SAMPLES]
            return weight_rounding.gptq_weights(ctx.calibrated, samples)

        return ctx.once(("gptq", fit.groups), made)
