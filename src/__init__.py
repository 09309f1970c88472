"""pagedprefix: prefix sharing over a paged KV cache — spec, implementation, kernels, conformance.

Subpackages:

- ``pagedprefix.spec``: the executable specification (the oracle).
- ``pagedprefix.impl``: the optimized block manager, block tables and KV cache.
- ``pagedprefix.kernels``: Triton kernels with torch reference versions.
- ``pagedprefix.conformance``: adapters, test vectors and the stateful conformance runner.
- ``pagedprefix.replay``: replay of real request traces (Mooncake FAST'25).
"""

__version__ = "0.1.0"
