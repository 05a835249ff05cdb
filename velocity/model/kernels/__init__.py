"""The kernels: the CPU's C++ (csrc/, built by cpu_kernels for the CPU's ISA, cpu_isa) and the GPU
decoder layer's Triton kernels (gpu_kernels)."""
