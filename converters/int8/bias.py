"""`bias`: min/max with each layer's bias corrected for its int8 kernel's mean error
(converters/int8/bias_correction.py), one set of biases a fit."""

from __future__ import annotations

from edgekit.converters.int8 import bias_correction
from edgekit.converters.int8.base import Candidate, Fit
from edgekit.converters.int8.context import Context
from edgekit.converters.int8.ranges import quantize
from edgekit.errors import ConversionError, one_line


class BiasCorrection(Candidate):
    name = bias_correction.NAME
    start_order = 1

    def make(self, ctx: Context, fit: Fit, *, view: bool, final: bool = False) -> bytes:
        """The file it measured on with its biases written in, but for the `final` file: TFLite's quantizer
        on the corrected float model (`basis`, which the budget autopilot quantizes its mixes from), which
        rounds a few int32 biases one step the other way (converters/int8/bias_correction.py)."""
        if not final:
            measured_on, correction = self._correction(ctx, fit, view)
            if measured_on == view and ctx.io == "float32":  # the file it measured on, its biases written in
                return correction.tflite
        return quantize(self._corrected(ctx, fit, view), ctx.io, None)

    def basis(self, ctx: Context, fit: Fit) -> bytes | None:
        return self._corrected(ctx, fit, False)

    def float_kernels(self, ctx: Context, fit: Fit) -> bytes | None:
        """The uncorrected model: an op the budget autopilot keeps in float takes its own bias back (the
        corrected one made "every op in float" lose 0.56 points where the float model lost none)."""
        return ctx.model("", False)

    def _corrected(self, ctx: Context, fit: Fit, view: bool) -> bytes:
        """The calibrated model (`view`: its logits view) with the biases corrected on `fit` written in."""
        return bias_correction.with_biases(ctx.model("", view), self._correction(ctx, fit, view)[1].biases)

    def _correction(self, ctx: Context, fit: Fit, view: bool) -> tuple[bool, bias_correction.Correction]:
        """The biases corrected on `fit` (one set a fit), and whether they were measured on the logits view
        (the model first asked for; the other has the same tensors)."""
        return ctx.once(("bias", fit.groups), lambda: (view, _measured(ctx, fit.samples, view)))


def _measured(ctx: Context, samples: list, view: bool) -> bias_correction.Correction:
    """converters/int8/bias_correction.py's biases on `samples`, measured on the model scored (`view`; its
    tensors are the file's); any failure is one line (auto skips it)."""
    try:
        made = bias_correction.corrected(ctx.model("", view), samples, lambda c: quantize(c, "float32"),
                                         first=ctx.plain.get(view))
    except ConversionError:
        raise
    except Exception as exc:  # noqa: BLE001 - a graph it did not foresee: one line, auto goes on
        raise ConversionError(f"bias correction failed on this model: {one_line(exc)[:200]}") from None
    if made is None:
        raise ConversionError("bias correction found no layer with a bias to correct")
    return made
