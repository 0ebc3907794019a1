"""CheckGpuDelegateCompatibility(op_sig, flags) of gpu_compatibility.cc: a table from the op to its rule.
The rules live by family in rules_elementwise, rules_nn (layers and custom ops) and rules_tensor."""

from __future__ import annotations

from collections.abc import Callable

from edgekit.runtime.gpu_compat import rules_elementwise, rules_nn, rules_tensor
from edgekit.runtime.gpu_compat.checks import Flags
from edgekit.runtime.gpu_compat.signature import OpSignature

Rule = Callable[[OpSignature, Flags], "str | None"]

# the families name disjoint ops
RULES: dict[str, Rule] = {**rules_elementwise.RULES, **rules_nn.RULES, **rules_tensor.RULES}


def check_signature(sig: OpSignature, *, enhanced_broadcast: bool = False,
                    reducible_gather_indices: bool = False) -> str | None:
    """CheckGpuDelegateCompatibility(op_sig, flags): None when the GPU rules accept the op, else the
    C++ status message. The flags default to GpuCompatibilityFlags::kStandard, as in the C++."""
    rule = RULES.get(sig.op)
    if rule is None:
        return f"Not supported op {sig.op}"
    return rule(sig, Flags(enhanced_broadcast, reducible_gather_indices))


def _guarded(name: str, fn) -> str | None:
    try:
        return fn()
    except (IndexError, KeyError, TypeError) as exc:
        # approximation: the C++ would throw from .at() or read out of bounds on an operator with too
        # few tensors; we call such an operator unsupported instead.
        return f"{name}: operator has too few input/output tensors for its GPU rule ({type(exc).__name__})"
