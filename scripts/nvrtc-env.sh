#!/usr/bin/env bash
# Source this: installs NVRTC 13.0.88 from PyPI if it is not importable yet and
# puts its library directory on LD_LIBRARY_PATH, so every kernel variant can be
# compiled to cubin on a machine without a GPU or nvcc.
#   . scripts/nvrtc-env.sh
nvrtc_libdir() {
  python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null
}
dir=$(nvrtc_libdir)
if [ -z "$dir" ] || ! ls "$dir"/libnvrtc.so.13 >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88 >&2 || {
    echo "nvrtc-env: could not install nvidia-cuda-nvrtc==13.0.88 from PyPI" >&2
    return 1 2>/dev/null || exit 1
  }
  dir=$(nvrtc_libdir)
fi
export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
