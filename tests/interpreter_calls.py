"""Triton's interpreter without its cost per device-function call: the tests' kernels call dozens of ``@triton.jit``
functions a step, and the interpreter patches the language module anew at every such call (``_patch_lang``:
``inspect.getmembers`` over ``tl``, ``tl.tensor`` and ``tl.math``), much of an interpreted sweep's time.

Within a launch the launch's own patch is already in place, so a call's patch of the same modules sets every attribute
to what it already does (the builtins were wrapped, and are no longer builtins to wrap again). :func:`install` skips
exactly those: a call whose function sees a language module the launch did not patch is patched as before, and so is
every launch. The results are the interpreter's to the bit (tests/test_interpreter_calls.py); only the repeated work
goes.
"""

from __future__ import annotations

import functools
import inspect

#: The interpreter's own ``_patch_lang`` and ``GridExecutor.__call__``, once :func:`install` replaced them.
originals: dict[str, object] = {}
# Per open launch (one at a time): the language modules its own patch covers, None until that is in place.
_launches: list[frozenset[int] | None] = []


class _NoPatch:
    """The scope of a patch skipped: nothing to restore."""

    def restore(self) -> None:
        pass


@functools.cache
def _languages(fn) -> frozenset[int]:
    """The language modules ``fn``'s module sees, as ``_patch_lang`` picks them (a module imports them once)."""
    from triton.runtime.interpreter import tl

    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def _launch(self, *args, **kwargs):
    _launches.append(None)
    try:
        return originals["launch"](self, *args, **kwargs)
    finally:
        _launches.pop()


def _patch_lang(fn):
    seen = _languages(fn)
    if _launches and _launches[-1] is not None and seen <= _launches[-1]:
        return _NoPatch()  # a device-function call inside a launch that patched its modules: nothing to do
    scope = originals["patch_lang"](fn)
    if _launches and _launches[-1] is None:
        _launches[-1] = seen  # the launch's own patch, made before it runs its programs
    return scope


def install() -> bool:
    """Patch the interpreter of the installed Triton, if it has the shape this was written for; returns whether."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    if not all(hasattr(interpreter, name) for name in ("_patch_lang", "GridExecutor", "tl")):
        return False
    if not originals:
        originals.update(patch_lang=interpreter._patch_lang, launch=interpreter.GridExecutor.__call__)
        interpreter._patch_lang = _patch_lang
        interpreter.GridExecutor.__call__ = _launch
    return True
