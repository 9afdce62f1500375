"""tests/interpreter_calls.py: a launch patches Triton's language once, not at each of its device-function calls,
and computes what the interpreter as it comes computes, bit for bit."""

import os

import interpreter_calls
import pytest
import torch
from conftest import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton's interpreter is not in use")

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _step(x, k):
        return tl.sigmoid(x * k) + tl.exp(-x)

    @triton.jit
    def _calls_kernel(x_ptr, out_ptr, n, CALLS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        x = tl.load(x_ptr + offs, mask=ok)
        for _ in range(CALLS):
            x = _step(x, 0.5)
        tl.store(out_ptr + offs, x, mask=ok)


def _run(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    _calls_kernel[(3,)](x, out, x.numel(), CALLS=5, BLOCK=16)
    return out


def test_a_launch_patches_once_and_computes_as_the_interpreter_does(monkeypatch):
    from triton.runtime import interpreter

    assert interpreter._patch_lang is interpreter_calls._patch_lang  # installed by conftest
    patched = []
    original = interpreter_calls.originals["patch_lang"]

    def counting(fn):
        patched.append(fn.__name__)
        return original(fn)

    x = torch.randn(37)
    with monkeypatch.context() as m:  # the interpreter as it comes: it patches at every call, 5 a program
        m.setattr(interpreter, "_patch_lang", counting)
        m.setattr(interpreter.GridExecutor, "__call__", interpreter_calls.originals["launch"])
        want = _run(x)
    assert patched == ["_calls_kernel"] + ["_step", "sigmoid"] * 15  # 3 programs of 5 calls
    patched.clear()
    monkeypatch.setitem(interpreter_calls.originals, "patch_lang", counting)
    # tl.sigmoid's module sees triton.language.core, which the kernel's launch did not patch: it is patched as before
    assert torch.equal(_run(x), want) and patched == ["_calls_kernel"] + ["sigmoid"] * 15
    patched.clear()
    assert torch.equal(_run(x), want) and patched[0] == "_calls_kernel"  # each launch patches anew
