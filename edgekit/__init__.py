"""edgekit: get a trained Keras model onto a small device, smaller and faster, and prove the cost."""

__version__ = "0.1.0"
