"""A fine-tuning's epochs as progress lines: a Keras callback that sends each finished epoch, with its loss
and the time left, to edgekit's `progress` callback (Keras's own `verbose` lines go to stdout, which
stays the command's output)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgekit.progress import Countdown, Step, seconds


def fit_step(stage: str, epochs: int, lr: float) -> Step:
    """The line that opens `stage`'s fine-tune (epoch 0 of `epochs`)."""
    return Step(f"{stage}: fine-tuning for {epochs} epoch(s) at learning rate {lr:g}", stage=f"{stage} epochs",
                done=0, total=epochs)


def epoch_step(stage: str, epoch: int, epochs: int, loss: float | None, left: float) -> Step:
    """The line of `stage`'s epoch `epoch` (1-based) of `epochs`."""
    said = "" if loss is None else f", loss {loss:.4g}"
    return Step(f"{stage}: epoch {epoch}/{epochs}{said}, {seconds(left)} left", stage=f"{stage} epochs",
                done=epoch, total=epochs, seconds_left=left)


def epoch_lines(stage: str, epochs: int, progress: Callable[[str], Any], base: type | None = None):
    """A Keras callback that calls `progress` with an `epoch_step` at the end of every epoch: a tf_keras one
    (fine-tuning trains tf_keras models), or one of `base` (Keras 3's `keras.callbacks.Callback`)."""
    if base is None:
        import tf_keras

        base = tf_keras.callbacks.Callback

    class EpochLines(base):  # type: ignore[misc, valid-type]
        def on_train_begin(self, logs=None) -> None:
            self.countdown = Countdown(epochs)

        def on_epoch_end(self, epoch: int, logs=None) -> None:
            loss = (logs or {}).get("loss")
            progress(epoch_step(stage, epoch + 1, epochs, None if loss is None else float(loss),
                                self.countdown.left(epoch + 1)))

    return EpochLines()
