"""Render fused kernels as Triton and C++/OpenMP source, and compile them."""
