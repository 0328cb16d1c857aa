"""kerneltrial: controlled trials for GPU kernels and LLM serving."""

__version__ = "0.1.0"
