"""edgekit.converters: everything that needs TensorFlow (load, quantize, convert, verify, write)."""
