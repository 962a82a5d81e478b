"""One warm call of kernels.chebyshev for Nsight Compute (issue 7: why the roofline miss).

    ncu --kernel-name regex:chebyshev --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        python3 benchmarks/ncu_chebyshev.py [bfloat16|float32]
"""

import sys

import torch

sys.path.insert(0, "benchmarks")
from bench import ridge_problems  # noqa: E402

import kernels  # noqa: E402

dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
A, q, L, mu = ridge_problems(16384)
A, q = A.to(dtype), q.to(dtype)
for _ in range(3):
    kernels.chebyshev(A, q, L=L, mu=mu, iters=30)
torch.cuda.synchronize()
