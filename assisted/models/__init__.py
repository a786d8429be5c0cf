"""Models: loading targets, tokenizers and assistants (loading.py), named offline sources (sources.py), pre-packed CPU
weights (packing.py), int4 assistant copies (int4.py) and the row-invariant int8 (int8.py)."""
