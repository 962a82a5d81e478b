"""The toolkit's kernels with their tf32 products, for harness runs under the tf32 contract."""

import functools

import kernels
from analysis.testing.koopman_strategy import koopman_kernel

chebyshev = functools.partial(kernels.chebyshev, input_precision="tf32")
cg = functools.partial(kernels.cg, input_precision="tf32")
koopman = functools.partial(koopman_kernel, input_precision="tf32")
