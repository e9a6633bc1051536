"""Where this Python's NVIDIA pip wheels keep the CUDA libraries the cuda
plugin opens at run time (gpu/cuda/cuda_dynload.c): torch built for CUDA 13
brings them in nvidia/cu13/lib, for CUDA 12 in nvidia/cublas/lib and
nvidia/cuda_cupti/lib. The plugin cannot see sys.path, so the folders found
here are handed to it in $TXK_CUDA_LIBDIRS (unless the user set it)."""
import os
import sys

WHEEL_DIRS = ("nvidia/cu13/lib", "nvidia/cublas/lib", "nvidia/cuda_cupti/lib")


def nvidia_lib_dirs(paths=None):
    """The wheel folders under each sys.path entry, in sys.path order."""
    out = []
    for p in (sys.path if paths is None else paths):
        for sub in WHEEL_DIRS:
            d = os.path.join(p or os.getcwd(), sub)
            if os.path.isdir(d) and d not in out:
                out.append(d)
    return out


def export_env(plugin=None):
    """Sets $TXK_CUDA_LIBDIRS (and $TXK_CUDA_PLUGIN to plugin) for the engine
    or a child process, leaving values the user set as they are."""
    dirs = nvidia_lib_dirs()
    if dirs:
        os.environ.setdefault("TXK_CUDA_LIBDIRS", os.pathsep.join(dirs))
    if plugin and os.path.exists(plugin):
        os.environ.setdefault("TXK_CUDA_PLUGIN", plugin)
