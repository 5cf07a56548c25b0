"""Bounds the BLAS threads of Debian's PyTorch to the script's --threads; import before torch.

Debian's PyTorch runs its matrix products on the system OpenBLAS, whose pthread build keeps its
own pool of one thread per core: torch.set_num_threads (OpenMP) does not bound it, so "1 thread"
ran every GEMM on both cores of a 2-core machine. OpenBLAS reads OPENBLAS_NUM_THREADS when it is
loaded, so importing this module (before torch) sets it from the command line's --threads N or
--threads=N (1 when absent or malformed; the script's argparse reports the latter).
"""
import os
import sys


def thread_count(argv):
    """The --threads value of argv, as a string ("1" when absent or malformed)."""
    for i, arg in enumerate(argv):
        value = arg[len("--threads="):] if arg.startswith("--threads=") else (
            argv[i + 1] if arg == "--threads" and i + 1 < len(argv) else None)
        if value is not None:
            return value if value.isdigit() and int(value) > 0 else "1"
    return "1"


os.environ["OPENBLAS_NUM_THREADS"] = thread_count(sys.argv[1:])
