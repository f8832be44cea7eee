"""OpenBLAS threads during a solve.

The parties' subproblems are small (a few hundred variables): BLAS calls on them run up to
100 times slower with a multi-threaded OpenBLAS when the cores are busy (its threads spin
on tiny products, and a parallel runtime's workers need those cores), so every method runs
with one BLAS thread by default (option ``blas_threads``; ``None`` leaves the setting
alone). Works on the OpenBLAS builds numpy and scipy ship (Linux); elsewhere a no-op.
"""

from __future__ import annotations

_SETTERS = (
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
)
_BLAS_LIBS: list | None = None


def _loaded_libraries() -> list[str]:
    """The paths of the shared objects loaded in this process, from the dynamic linker's
    list (``dl_iterate_phdr``, glibc and musl: one entry per object, where
    ``/proc/self/maps`` has one line per mapping); none where it is missing."""
    import ctypes

    class _Info(ctypes.Structure):  # (the leading fields of struct dl_phdr_info)
        _fields_ = [("addr", ctypes.c_void_p), ("name", ctypes.c_char_p)]

    found: list[str] = []

    def take(info, size, data) -> int:
        name = info.contents.name
        if name:
            found.append(name.decode(errors="replace"))
        return 0

    callback = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.POINTER(_Info), ctypes.c_size_t, ctypes.c_void_p
    )
    try:
        ctypes.CDLL(None).dl_iterate_phdr(callback(take), None)
    except (OSError, AttributeError):  # (no dynamic linker's list here)
        return []
    return found


def _openblas_handles() -> list:
    """(setter, getter) of every OpenBLAS loaded in this process (Linux; else none)."""
    global _BLAS_LIBS
    if _BLAS_LIBS is not None:
        return _BLAS_LIBS
    import ctypes

    handles = []
    paths = sorted({p for p in _loaded_libraries() if "openblas" in p.lower() and ".so" in p})
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _SETTERS:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                handles.append((getattr(lib, set_name), getattr(lib, get_name)))
                break
    _BLAS_LIBS = handles
    return handles


class blas_threads:
    """Context manager limiting OpenBLAS to ``n`` threads (``None``: leave it alone).

    See the module docstring for why; the previous setting is restored on exit.

    Examples
    --------
    >>> import numpy as np
    >>> from fedmodel.runtime.blas import blas_threads
    >>> with blas_threads(1):
    ...     _ = np.ones((50, 50)) @ np.ones(50)
    """

    def __init__(self, n: int | None):
        self.n = n
        self.saved: list = []

    def __enter__(self):
        if self.n is None:
            return self
        for setter, getter in _openblas_handles():
            try:
                self.saved.append((setter, int(getter())))
                setter(int(self.n))
            except Exception:  # pragma: no cover - exotic builds
                continue
        return self

    def __exit__(self, *exc):
        for setter, old in self.saved:
            try:
                setter(old)
            except Exception:  # pragma: no cover
                pass
        self.saved = []
        return False
