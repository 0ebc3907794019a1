"""edgekit.converters.int8: the int8 candidates `converters/int8/choose.py` scores, one module each behind one
protocol (`base.Candidate`: propose, make the file, score), named in one declared table (`registry.py`).
Nothing here is imported until a candidate is used."""
