# Download (here, with network) the wheels the GPU machine lacks into .whl/ (gitignored;
# name it in the device tool's `carry`). The GPU image has torch 2.11, triton 3.6, numpy,
# scipy, pandas, matplotlib, typer, rich, httpx, nvidia-ml-py; it lacks these:
set -e
cd "$(dirname "$0")/../.."
for pkg in liger-kernel==0.8.5 flag-gems==5.0.2 sqlalchemy pydantic==2.14.4 pydantic-core==2.50.5 \
           annotated-types typing-inspection tomli-w; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl "$pkg"
done
ls .whl
