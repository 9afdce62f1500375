"""The Triton kernels build for real GPUs: compiled ahead of time to PTX and cubin, without one.

The interpreter (which the bit-identity tests in test_buffer.py run) executes a kernel's Python, so it
cannot tell whether Triton's compiler accepts it; this test runs the compiler itself, with the
ptxas that the triton package ships, for the GPUs revnmt targets. It needs no GPU, but a process
where ``TRITON_INTERPRET`` is unset (the kernels are decorated for one mode at import).
"""

import textwrap

import pytest
from conftest import HAS_TRITON, compile_for_the_gpu

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install -e .[dev])")

_COMPILE = textwrap.dedent(r"""
    import sys

    from ptxas_log import compile_reported

    from buffers import TILE_ROWS
    from buffers.backends import triton_kernels as tk

    # The argument types the backend passes (h int32, masks bool, words int64, ...); z and u are the
    # float gates of an update, or int64 numerators (and an unused u) for push_mul / pop_div.
    TYPES = {"h_ptr": "*i32", "mask_ptr": "*i1", "out_ptr": "*i32", "curr_ptr": "*i64", "stack_ptr": "*i64",
             "capacity": "i32", "top_ptr": "*i64", "flags_ptr": "*u8",
             "status_ptr": "*i32", "lost_ptr": "*fp64", "lost_table_ptr": "*fp64", "batch": "i32", "width": "i32",
             "stored": "i32", "tile_rows": "i32", "lanes": "i32", "first_flag": "i32", "min_numerator": "i32",
             **{f"{t}_{s}": "i32" for t in "hzum" for s in ("rs", "cs")}}  # row and column strides
    options = tk.launch_options(TILE_ROWS * 16)  # a tile of the default rows on 16 lanes, the CUDA default
    constexprs = {"LANE_BLOCK": options.pop("LANE_BLOCK"), "ELEMENT_BLOCK": options.pop("ELEMENT_BLOCK")}
    spilled = []  # a spill is local memory traffic on every step of the walk: none may be there
    for arch in map(int, sys.argv[1:]):
        for kernel in (tk._push_kernel, tk._pop_kernel):
            for gates in (True, False):
                values = dict(constexprs, GATES=gates)
                types = dict(TYPES, z_ptr="*fp32" if gates else "*i64", u_ptr="*fp32" if gates else "*i64")
                signature = {name: "constexpr" if name in values else types[name] for name in kernel.arg_names}
                variant = f"sm_{arch} {kernel.fn.__name__} gates={gates}"
                compile_reported(kernel, signature, values, arch, options, variant, spilled)
    assert not spilled, "registers spill:\n" + "\n".join(spilled)
""")


@pytest.mark.parametrize("arch", [80, 90])
def test_kernels_compile_for_the_gpu(arch):
    printed = compile_for_the_gpu(_COMPILE, arch, timeout=300)
    assert printed.count(f"sm_{arch}") == 4
