"""The decoder's elementwise kernels (residual add + RMSNorm, SiLU * up, RoPE) against float32
torch references: random inputs, odd token counts and T = 1, strided views as the model passes
them. fp32 and fp16 run everywhere (the Triton interpreter on CPU); bf16 only on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_testutil import DEV, gen

from granikv.kernels import add_rms_norm_, rms_norm, rope_, silu_mul
from granikv.model.layers import rope_inv_freq
from granikv.model.spec import RopeScaling

DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.gpu),
]
# per element, against a float32 reference on the same (rounded) inputs: one output rounding
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rand(*shape, g, dtype, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEV)


def close(out: torch.Tensor, ref: torch.Tensor, dtype) -> None:
    assert out.dtype == dtype
    assert not torch.isnan(out).any(), "NaN in output (unwritten element?)"
    tol = TOL[dtype]
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), rtol=tol, atol=tol)


# -- RMSNorm ----------------------------------------------------------------------------------------

def rms_ref(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = h.float()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.float()


NORM_SHAPES = [(1, 64), (7, 200), (33, 4096), (256, 96)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,n", NORM_SHAPES)
def test_rms_norm(t, n, dtype):
    g = gen(t * 1000 + n)
    x = rand(t, n, g=g, dtype=dtype, scale=3.0)
    w = rand(n, g=g, dtype=dtype) + 1.0
    x0 = x.clone()
    y = rms_norm(x, w, 1e-5)
    close(y, rms_ref(x0, w, 1e-5), dtype)
    assert torch.equal(x, x0)  # input untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,n", NORM_SHAPES)
def test_add_rms_norm(t, n, dtype):
    g = gen(t * 1000 + n + 1)
    # x is a strided view (a column slice of a wider buffer), as a sublayer output may be
    wide = rand(t, n + 40, g=g, dtype=dtype)
    x = wide[:, 8:8 + n]
    res = rand(t, n, g=g, dtype=dtype, scale=2.0)
    w = rand(n, g=g, dtype=dtype) + 1.0
    want_res = (res.float() + x.float()).to(dtype)  # rounded once, as torch's `h + x`
    wide0 = wide.clone()
    y = add_rms_norm_(x, res, w, 1e-6)
    assert torch.equal(res, want_res)  # updated in place, bit for bit the torch add
    close(y, rms_ref(want_res, w, 1e-6), dtype)
    assert torch.equal(wide, wide0)  # x untouched


def test_rms_norm_matches_torch_rms_norm():
    g = gen(5)
    x = rand(9, 300, g=g, dtype=torch.float32)
    w = rand(300, g=g, dtype=torch.float32)
    out = torch.empty_like(x)
    assert rms_norm(x, w, 1e-5, out=out) is out
    torch.testing.assert_close(out, F.rms_norm(x, (300,), w, 1e-5), rtol=1e-5, atol=1e-5)


def test_norm_empty_and_bad_shapes():
    w = torch.ones(64, device=DEV)
    assert rms_norm(torch.empty(0, 64, device=DEV), w, 1e-5).shape == (0, 64)
    with pytest.raises(ValueError):
        rms_norm(torch.ones(3, 32, device=DEV), w, 1e-5)
    with pytest.raises(ValueError):
        add_rms_norm_(torch.ones(3, 64, device=DEV), torch.ones(2, 64, device=DEV), w, 1e-5)


# -- SiLU * up --------------------------------------------------------------------------------------

def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.float().chunk(2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,inter", [(1, 64), (7, 300), (33, 1500), (256, 128)])
def test_silu_mul(t, inter, dtype):
    g = gen(t * 100 + inter)
    gate_up = rand(t, 2 * inter, g=g, dtype=dtype, scale=3.0)
    gate_up[0, 0] = -60.0  # exp overflow side: silu -> -0
    y = silu_mul(gate_up, block=256)  # small blocks: several per row, a partial last one
    assert y.shape == (t, inter)
    close(y, silu_mul_ref(gate_up), dtype)


def test_silu_mul_strided_rows():
    g = gen(9)
    wide = rand(5, 2 * 100 + 6, g=g, dtype=torch.float32)
    gate_up = wide[:, :200]
    close(silu_mul(gate_up), silu_mul_ref(gate_up), torch.float32)
    with pytest.raises(ValueError):
        silu_mul(wide[:, :201])


# -- RoPE -------------------------------------------------------------------------------------------

LLAMA3 = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)


def cos_sin_table(d: int, positions: int, dtype) -> torch.Tensor:
    """RotaryEmbedding's table: Llama-3 scaled frequencies, [P, d] = cos | sin, in dtype."""
    inv = rope_inv_freq(d, 500000.0, LLAMA3)
    f = torch.arange(positions).float()[:, None] * inv[None, :]
    return torch.cat((f.cos(), f.sin()), dim=-1).to(dtype).to(DEV)


def rope_ref(x: torch.Tensor, pos: torch.Tensor, cs: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    c = cs.float()[pos.long()][:, None]
    cos, sin = c[..., :half], c[..., half:]
    x = x.float()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,hq,hkv,d", [(1, 8, 2, 32), (7, 32, 8, 128), (33, 5, 1, 64), (256, 4, 4, 16)])
def test_rope_in_place_on_qkv_view(t, hq, hkv, d, dtype):
    """q and k rotated together in place in the fused qkv buffer; v untouched."""
    g = gen(t + hq + d)
    qkv = rand(t, (hq + 2 * hkv) * d, g=g, dtype=dtype)
    cs = cos_sin_table(d, 300, dtype)
    pos = torch.randint(0, 300, (t,), generator=g).to(DEV)
    before = qkv.clone()
    qk = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)
    assert rope_(qk, pos, cs) is qk
    close(qk, rope_ref(before[:, : (hq + hkv) * d].view(t, hq + hkv, d), pos, cs), dtype)
    assert torch.equal(qkv[:, (hq + hkv) * d:], before[:, (hq + hkv) * d:])


def test_rope_matches_rotary_embedding_module():
    """Same layout as the torch path of the model (RotaryEmbedding.forward), int32 positions and
    a non-contiguous positions view."""
    from granikv.model.layers import RotaryEmbedding
    from granikv.model.spec import load_spec

    spec = load_spec("tiny")
    rope = RotaryEmbedding(spec, 512, torch.float32, DEV)
    g = gen(11)
    x = rand(13, 10, spec.head_dim, g=g, dtype=torch.float32)
    pos = torch.randint(0, 512, (26,), generator=g).to(torch.int32).to(DEV)[::2]
    want = rope(x, pos)
    torch.testing.assert_close(rope_(x.clone(), pos, rope.cos_sin), want, rtol=1e-5, atol=1e-5)


def test_rope_bad_shapes():
    cs = cos_sin_table(32, 10, torch.float32)
    with pytest.raises(ValueError):
        rope_(torch.ones(3, 2, 16, device=DEV), torch.zeros(3, dtype=torch.long, device=DEV), cs)
    with pytest.raises(ValueError):
        rope_(torch.ones(3, 2, 32, device=DEV), torch.zeros(4, dtype=torch.long, device=DEV), cs)
