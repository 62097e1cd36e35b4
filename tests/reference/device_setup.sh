# Sourced by the device benchmark scripts (bench_structured.sh, bench_speculative.sh), from the
# repository root on the GPU machine: installs the Vulkan loader's Debian packages from .gl/,
# points the loader at the NVIDIA driver, unpacks the release binary to .bench/backpack, and
# stages the gguf writer (PYTHONPATH) and SmolLM2's tokenizer (/tmp/tok.json) that
# make_bench_gguf.py reads; all staged by tests/reference/bench_llamacpp.sh --stage.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
xz -dc .bench/backpack.xz > .bench/backpack && chmod +x .bench/backpack
pip install --no-deps -q --target /tmp/gg .bench/gguf-0.19.0-py3-none-any.whl 2>/dev/null
export PYTHONPATH=/tmp/gg
xz -dc .bench/smollm2-tokenizer.json.xz > /tmp/tok.json
