"""The Triton kernels every target runs (NVIDIA SM80-SM120, AMD CDNA/RDNA, the CPU
interpreter): the attention tiles ``rows`` and ``vsplit``, the split-KV merge, the KV-cache
writer and the FP8 staging of long extend batches, and the building blocks they share
(``tiles.py``, ``fp8_decode.py``, ``codec.py``)."""
