"""The extend kernel (both its one-split and its split-keys variant) and its fold, and the prefix
kernel's flattened form with its level merge, compile for an H200 (sm_90) on a host without a
GPU: Triton's CUDA backend lowers to PTX and runs ptxas, which catches what the interpreter does
not (types of loop bounds, scalar/tensor mixes in compiled control flow). Runs in a subprocess
with the interpreter off (the test session turns it on)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from granikv.kernels.extend import _extend_kernel, _fold_extend_kernel

    target = GPUTarget("cuda", 90, 32)
    ptrs = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "SlotTable": "*i32", "Rows": "*i32",
            "QoIndptr": "*i32", "PrefixLen": "*i32", "O": "*bf16", "PartO": "*fp32", "PartLse": "*fp32"}
    for split in (False, True):
        consts = {"G": 4, "D": 128, "BLOCK_M": 128, "BLOCK_N": 64, "UPCAST": False, "PREC": "tf32",
                  "SPLIT": split}
        sig = {a: "constexpr" if a in consts else ptrs.get(a, "fp32" if a == "qk_scale" else "i32")
               for a in _extend_kernel.arg_names}
        k = triton.compile(ASTSource(_extend_kernel, sig, constexprs=consts), target=target,
                           options={"num_warps": 4, "num_stages": 3})
        assert k.asm.get("cubin"), "no cubin"
        print("extend", split, "ok")
    consts = {"D": 128, "S_PAD": 32}
    sig = {a: "constexpr" if a in consts else "*fp32" if a in ("PartO", "PartLse", "Lse")
           else "*bf16" if a == "O" else "i32" for a in _fold_extend_kernel.arg_names}
    k = triton.compile(ASTSource(_fold_extend_kernel, sig, constexprs=consts), target=target,
                       options={"num_warps": 4})
    assert k.asm.get("cubin"), "no cubin"
    print("fold ok")
    from granikv.kernels.prefix_cascade import _prefix_kernel
    from granikv.kernels.merge import _merge_levels_kernel

    consts = {"G": 4, "D": 128, "BLOCK_M": 64, "BLOCK_N": 128, "MIN_SPLIT_LEN": 256, "DIRECT": False,
              "SLAB": False, "USE_TMA": False, "UPCAST": False, "PREC": "tf32", "FLAT": True}
    bf16 = {"Q", "K", "V", "KDesc", "VDesc", "O"}
    f32 = {"Lse", "PartO", "PartLse"}
    i32p = {"Indptr", "Reqs", "PrefixLen", "SlabBase", "PageRows", "SlotTable", "ItemClass", "ItemTile", "Level"}
    sig = {a: "constexpr" if a in consts else "*bf16" if a in bf16 else "*fp32" if a in f32
           else "*i32" if a in i32p else "fp32" if a == "qk_scale" else "i32" for a in _prefix_kernel.arg_names}
    k = triton.compile(ASTSource(_prefix_kernel, sig, constexprs=consts), target=target,
                       options={"num_warps": 4, "num_stages": 3})
    assert k.asm.get("cubin"), "no cubin"
    print("flat ok")
    consts = {"D": 128, "S_PAD": 2}
    sig = {a: "constexpr" if a in consts else "*bf16" if a == "O" else "*fp32" if a in ("Lse", "PartO", "PartLse")
           else "*i32" if a == "Mask" else "i32" for a in _merge_levels_kernel.arg_names}
    k = triton.compile(ASTSource(_merge_levels_kernel, sig, constexprs=consts), target=target,
                       options={"num_warps": 4})
    assert k.asm.get("cubin"), "no cubin"
    print("levels ok")
''')


def _cuda_backend_available() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(not _cuda_backend_available(), reason="Triton's NVIDIA backend is not installed")
def test_extend_and_flat_prefix_kernels_compile_for_sm90(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["extend", "False", "ok", "extend", "True", "ok", "fold", "ok", "flat", "ok", "levels",
                                "ok"]
