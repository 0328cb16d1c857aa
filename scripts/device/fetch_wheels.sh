# Download (here, with network) the wheels the GPU machine lacks into .whl/ (gitignored;
# name it in the device tool's `carry`). The GPU image has torch 2.11, triton 3.6, numpy,
# scipy, pandas, matplotlib, typer, rich, httpx, nvidia-ml-py; it lacks these:
set -e
cd "$(dirname "$0")/../.."
for pkg in liger-kernel==0.8.5 flag-gems==5.0.2 sqlalchemy pydantic==2.14.4 pydantic-core==2.50.5 \
           annotated-types typing-inspection tomli-w pyseccomp==0.1.2; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$pkg"
done
# SGLang's kernel namespace (the `sglang` peer, ops/peers_sglang.py) and what importing it
# needs beyond the image: its wheel is built for manylinux_2_34 (the image is Ubuntu 24.04,
# glibc 2.39). apache-tvm-ffi loads its JIT CUDA kernels; the rest are imported by
# sglang.srt.utils, which the kernel namespace imports (measured: scripts/device/sglang_probe.py).
for pkg in sglang==0.5.23 apache-tvm-ffi==0.1.11 msgspec==0.23.0 orjson==3.13.0 pybase64==1.5.1 \
           starlette==1.10.0 pyzmq==27.3.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl "$pkg"
done
# FlashInfer (the `flashinfer` peer, ops/peers_flashinfer.py): 0.6.7.post3 is a 9.2 MB wheel and
# imports flashinfer.norm / flashinfer.activation with apache-tvm-ffi (above) and the image's
# nvidia-ml-py alone (docs/NOTES.md, issue 27); 0.7.x is 101 MB and would need slimming. Its
# kernels build with nvcc and ninja at first use. QuACK is not fetched: its CuTe DSL compiler
# (nvidia-cutlass-dsl-libs-cu12, 87 MiB in one .so) exceeds one call's 64 MiB (docs/NOTES.md).
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform any -d .whl flashinfer-python==0.6.7.post3
# The sglang wheel is 39 MB, mostly Rust extensions the kernel namespace never imports; keep
# sglang/kernels/ (Python and the JIT CUDA sources) and the .py files of sglang/srt/.
python3 scripts/device/slim_wheel.py .whl/sglang-0.5.23-*.whl sglang/kernels/ --py-only sglang/srt/
ls .whl
