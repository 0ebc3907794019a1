"""`gptq`: GPTQ-rounded kernels (converters/int8/weight_rounding.py) on another candidate's calibrated model
(its `basis`: min/max's by default; under `auto`, the cheap candidates' winner, or the best range method
where the winner sets no ranges): the
rounded float weights written into that model, TFLite's quantizer after, which keeps them exactly. `auto`
scores it only after the cheap candidates, where the winner still leaves a loss (`choose._escalate`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgekit.converters.int8 import weight_rounding
from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.context import Context
from edgekit.converters.int8.ranges import logits_view, quantize
from edgekit.errors import ConversionError, one_line
from edgekit.runtime.schema import with_tensor_data

MAX_SAMPLES = 200  # calibration samples the Hessians are summed over (evenly spaced): EfficientNetB0 64x64 1.3x plain


class Gptq(Candidate):
    name = "gptq"
    start_order = 6
    costly = True

    def __init__(self, on: Candidate | None = None) -> None:
        from edgekit.converters.int8.minmax import MinMax

        self.on = on if on is not None else MinMax()  # the candidate whose calibrated model it rounds
        self._checked: dict[str, Any] = {}

    def offered(self, ctx: Context) -> bool:
        """Not among the cheap candidates `auto` scores together: it escalates to it (`choose._escalate`)."""
        return False

    def make(self, ctx: Context, fit: Fit, *, view: bool, final: bool = False) -> bytes:
        """TFLite's quantizer on the base candidate's calibrated model (`view`: its logits view, the same
        tensors) with the kernels GPTQ rounded on `fit`; the `final` file is checked to hold GPTQ's int8
        kernels exactly."""
        data, qs = self._rounded(ctx, fit)
        made = quantize(with_tensor_data(self._model(ctx, fit, view), data), ctx.io)
        if final:
            self._checked = {"method": self.name, "on": self.on.name, "layers": len(qs),
                             "differ": weight_rounding.mismatched(made, qs, self._model(ctx, fit, False))}
        return made

    def basis(self, ctx: Context, fit: Fit) -> bytes | None:
        return with_tensor_data(self._model(ctx, fit, False), self._rounded(ctx, fit)[0])

    def float_kernels(self, ctx: Context, fit: Fit) -> bytes | None:
        return self._model(ctx, fit, False)

    def findings(self) -> dict[str, Any]:
        return {"weight_rounding": self._checked} if self._checked else {}

    def _model(self, ctx: Context, fit: Fit, view: bool) -> bytes:
        """The base candidate's calibrated model, its ranges written in (`view`: its logits view)."""
        def based() -> bytes:
            made = self.on.basis(ctx, fit)
            return ctx.calibrated if made is None else made

        basis = ctx.once(("gptq basis", self.on.name, fit.groups), based)
        if not view:
            return basis
        if basis is ctx.calibrated:
            return ctx.model("", True)
        return ctx.once(("gptq view", self.on.name, fit.groups), lambda: logits_view(basis, ctx.output) or basis)

    def _rounded(self, ctx: Context, fit: Fit) -> tuple[dict[int, np.ndarray], dict[str, np.ndarray]]:
        """GPTQ's kernels on (at most `MAX_SAMPLES` of) the fit's samples, once a fit and base."""
        def made() -> tuple[dict[int, np.ndarray], dict[str, np.ndarray]]:
            samples = fit.samples[:: max(1, len(fit.samples) // MAX_SAMPLES)][:MAX_SAMPLES]
            try:
                found = weight_rounding.gptq_weights(self._model(ctx, fit, False), samples)
            except Exception as exc:  # noqa: BLE001 - a graph or Hessian it did not foresee: one line, auto goes on
                raise ConversionError(f"GPTQ weight rounding failed on this model: {one_line(exc)[:200]}") from None
            if not found[1]:
                raise ConversionError("GPTQ found no Conv / DepthwiseConv / Dense kernel to round")
            return found

        return ctx.once(("gptq", self.on.name, fit.groups), made)
