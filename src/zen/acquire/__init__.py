"""Acquisition: the process writer (`zen acquire`) and the GPU routes (driver dump, cuda-gdb)."""
