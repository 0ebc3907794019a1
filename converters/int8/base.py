"""The int8 candidate protocol: what a way of making the int8 file declares and does, so that
`choose.choose` scores any of them on one path (fitted on some samples, compared with the float model on
others) and never asks which one it is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgekit.converters.int8.context import Context


@dataclass(frozen=True)
class Fit:
    """The samples a candidate is fitted on: their groups (`choose._folds`: "a", "b" or both; a key for what
    is made once per fit) and the samples themselves."""

    groups: tuple[str, ...]
    samples: list


class Candidate:
    """One way to make the int8 file from the converter's calibrated model. Subclass it in a module of this
    folder and name it in `registry.CANDIDATES` (or `registry.register` it): `auto` then scores it beside the
    others, and `choose(method=its name)` makes its file."""

    name: str = ""
    # the order candidates start in when two are scored at once, lowest first: a variant (its moved ranges
    # measured on every sample) first, then bias correction, which needs no activations: the worker free
    # first takes it while the other still collects them for percentile and mse (a ViT: percentile first
    # left that worker waiting 0.25 s; the two range methods started together, 2.6 s of scoring)
    start_order: int = 0
    # fits ranges on the activations collected on the converter's calibrated model (`Context.activations`):
    # auto collects them while min/max is scored
    fits_ranges: bool = False
    # the converter's own file for a model with the float function (min/max ranges on an equalised variant):
    # where its score leaves nothing to win, as min/max's does, `auto` starts no other candidate (a ConvNeXt
    # with 200x outlier features: equalize agreed on all 200 held-out samples at a KL of 0.0001, and the six
    # scored after it took auto to 1.65x plain's conversion time); `--calib-effort thorough` scores them all
    conclusive: bool = False
    # its work costs more than a quantize and a scoring (a model rebuilt, kernels rounded): `auto` scores it
    # only where the winner so far leaves a loss that winning back could be shown (`scoring.cannot_pay`)
    costly: bool = False

    def offered(self, ctx: Context) -> bool:
        """Whether `auto` scores it on this conversion at all (a variant only where one was made)."""
        return True

    def unusable(self, io: str) -> str | None:
        """Why it cannot make a file with these inputs and outputs (`auto` records it as skipped), or None."""
        return None

    def make(self, ctx: Context, fit: Fit, *, view: bool, final: bool = False) -> bytes:
        """The int8 file fitted on `fit`; with `view`, its logits view (`ranges.logits_view`: what is scored
        for class scores); `final`: the file written. Raises ConversionError where it cannot be made."""
        raise NotImplementedError

    def findings(self) -> dict[str, Any]:
        """What it adds to `calibration.range_setting` after making the final file (gptq: its exactness
        check); empty for most."""
        return {}

    def float_kernels(self, ctx: Context, fit: Fit) -> bytes | None:
        """Where `basis` holds constants changed for int8 (gptq's rounded kernels, bias's corrected biases):
        the model whose constants an op kept in float takes; None where they are the float model's (most)."""
        return None

    def basis(self, ctx: Context, fit: Fit) -> bytes | None:
        """The calibrated model its file is quantized from, its ranges written in (the budget autopilot
        makes its mixes from it; for ai-edge-quantizer's file, the ranges it chose); None where none is
        (the autopilot then starts from the converter's min/max model)."""
        return None
