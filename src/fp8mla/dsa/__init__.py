"""DeepSeek Sparse Attention (DSA) over the packed 656-byte FP8 MLA cache: the cache format
(:mod:`fp8mla.dsa.layout`), its writer and reader, and sparse MLA attention over each query
token's chosen tokens."""
