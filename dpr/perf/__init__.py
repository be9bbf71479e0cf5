"""Performance accounting shared by the benchmarks: CPU features, model FLOPs, measured matmul peaks."""

from dpr.perf.cpu import cpu_flags, cpu_supports_bf16
from dpr.perf.flops import encoder_forward_flops, mfu, total_flops
from dpr.perf.peak import matmul_peak_gflops

__all__ = ["cpu_flags", "cpu_supports_bf16", "encoder_forward_flops", "mfu",
           "matmul_peak_gflops", "total_flops"]
