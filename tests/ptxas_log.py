"""What the ahead-of-time compile tests share: a Triton kernel compiled for a GPU with ptxas's verbose log read back.

ptxas states a kernel's registers and spills only in its verbose log, which Triton prints (to stdout) when asked;
compiling past Triton's cache makes ptxas run, and log, every time. Imported by the compile scripts that
tests/buffers/test_triton_kernels.py, tests/revnmt/rnn/test_triton_steps.py and test_triton_sweeps.py run in a
process of their own (``conftest.compile_for_the_gpu``: without ``TRITON_INTERPRET``, this folder on ``PYTHONPATH``).
"""

import contextlib
import io
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

triton.knobs.nvidia.dump_ptxas_log = True
triton.knobs.compilation.always_compile = True


def compile_logged(kernel, signature: dict, values: dict, arch: int, options: dict):
    """The compiled kernel, ptxas's registers per thread for its entry, and the bytes it spills (stored, loaded)."""
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(ASTSource(kernel, signature, values), target=GPUTarget("cuda", arch, 32),
                                  options=options)
    log = log.getvalue()
    used = re.search(rf"Compiling entry function '{re.escape(compiled.metadata.name)}'.*?Used (\d+) registers",
                     log, re.S)
    spills = [tuple(map(int, m)) for m in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    assert used and spills, f"no ptxas log for {compiled.metadata.name} on sm_{arch}:\n{log}"
    return compiled, int(used.group(1)), tuple(map(sum, zip(*spills)))


def compile_reported(kernel, signature: dict, values: dict, arch: int, options: dict, variant: str,
                     spilled: list[str]):
    """:func:`compile_logged`, its cubin checked and a line printed for ``variant`` (registers, spills); a variant
    that spills is added to ``spilled``. Returns the compiled kernel."""
    compiled, registers, (stored, loaded) = compile_logged(kernel, signature, values, arch, options)
    assert compiled.asm["cubin"] and ".entry" in compiled.asm["ptx"]
    print(f"{variant}: {len(compiled.asm['cubin'])} bytes of cubin, {registers} registers, {stored}+{loaded} bytes "
          "spilled")
    if stored or loaded:
        spilled.append(f"{variant}: {stored} bytes spill stores, {loaded} bytes spill loads, {registers} registers")
    return compiled
