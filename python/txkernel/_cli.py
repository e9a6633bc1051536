"""The `txk` and `txkernel` commands of the wheel: each runs the binary the
wheel carries in txkernel/bin/ (built by the project's Makefile, its
libraries in the wheel beside it), telling it where the cuda plugin and the
NVIDIA pip wheels' CUDA libraries are. Installed with `pip install .`, which
builds only the engine library, the commands run the binary of that name
further along PATH (`make install` puts it in /usr/local/bin), so they never
hide it."""
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def binary(name):
    return os.path.join(HERE, "bin", name)


def _on_path(name):
    """The first `name` on PATH that is not this command itself."""
    me = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    for d in os.environ.get("PATH", "").split(os.pathsep):
        p = shutil.which(name, path=d) if d else None
        if p and os.path.realpath(p) != me:
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    return p
    return None


def _exec(name):
    from ._cudalibs import export_env
    path = binary(name)
    if not os.access(path, os.X_OK):
        path = _on_path(name)
        if not path:
            sys.stderr.write(f"{name}: this install of the txkernel companion has no {name} binary (`pip install .` "
                             f"builds only the engine library) and none is on PATH: install the wheel (make wheel) "
                             f"or run `make install` in the repository\n")
            return 127
    else:
        export_env(os.path.join(HERE, "libtk_cuda.so"))
    os.execv(path, [name] + sys.argv[1:])


def txk():
    return _exec("txk")


def txkernel():
    return _exec("txkernel")
