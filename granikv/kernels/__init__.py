"""Attention kernels of GraniKV (Triton), one op per module; `ref.py` holds float32 references.

Storage contract: one slot space per layer, `k_cache`, `v_cache` of shape [num_slots, H_kv, d];
position j of a request lives in slot `slot_table[row, j]` (int32 [max_rows, max_ctx]); slot 0
is a dummy. All index tensors are int32 on the device; no op reads them on the host, so every
op is CUDA-graph capturable given fixed buffers (`out`, `lse`, `workspace`). Outputs: o in the
query dtype, lse float32 in natural log, -inf where a row saw no key.

API
- store_kv(k_cache, v_cache, slots[T], k[T,Hkv,d], v[T,Hkv,d]) -> None
- decode_paged(q[B,Hq,d], k_cache, v_cache, slot_table, rows[B], kv_start[B], kv_len[B], sm_scale,
  out=None, lse=None, max_splits=None, workspace=None, cfg=None) -> (o[B,Hq,d], lse[B,Hq])
  reads positions [kv_start, kv_start + kv_len) of each row; kv_len 0 -> o = 0, lse = -inf.
  Split count per request decided on the device, at most `max_splits` (host, from shapes:
  `decode_max_splits`); workspace = SplitWorkspace.allocate(B, Hq, max_splits, d, device).
- prefix_cascade(q, k_cache, v_cache, classes: PrefixClasses, sm_scale, out=None, lse=None,
  max_splits=None, workspace=None, cfg=None) -> (o, lse): each class's queries against its
  prefix (HOT slab `slab_base`, or `page_rows` of `slot_table` for the cascade baseline);
  requests in no class are left untouched.
- prefix_dense(q, k_cache, v_cache, classes, sm_scale, out=None, lse=None, impl="auto", ...)
  -> (o, lse): the same over slabs only, as one fat contraction (fused Triton or cuBLAS form).
- merge_lse_(o_a, lse_a, o_b, lse_b) -> None: in place into (o_a, lse_a), float32 math.
- extend(q[T,Hq,d], k_cache, v_cache, slot_table, rows[N], qo_indptr[N+1], prefix_len[N], sm_scale,
  out=None, max_qo_len=None, cfg=None, max_kv_len=None, splits=None, policy=None) -> o[T,Hq,d]:
  cached prefix + causal new part; a step too small to fill the GPU splits its keys
  (`extend_splits`, from the host bound `max_kv_len`) and folds the float32 partials.

Elementwise ops of the decoder (float32 math, one rounding, one launch each):
- rms_norm(x[T,N], w[N], eps, out=None) -> y; add_rms_norm_(x, residual, w, eps, out=None) -> y:
  residual += x in place, then y = rmsnorm(residual) * w.
- silu_mul(gate_up[T,2I], out=None) -> silu(gate) * up [T,I].
- rope_(x[T,H,d], positions[T], cos_sin[P,d]) -> x: rotate-half RoPE in place (strided views ok).

On CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1); there 16-bit inputs are
upcast to float32 after each load, since the interpreter's bf16 arithmetic is unreliable.
"""

from granikv.kernels.act import silu_mul
from granikv.kernels.decode_paged import DecodeConfig, decode_max_splits, decode_paged
from granikv.kernels.extend import ExtendConfig, ExtendSplitPolicy, extend, extend_splits
from granikv.kernels.merge import merge_lse_
from granikv.kernels.norm import add_rms_norm_, rms_norm
from granikv.kernels.prefix_cascade import CASCADE_CONFIG, PrefixConfig, prefix_cascade
from granikv.kernels.prefix_classes import PrefixClasses
from granikv.kernels.prefix_dense import DENSE_CONFIG, prefix_dense, prefix_dense_cublas
from granikv.kernels.rope import rope_
from granikv.kernels.splits import SplitWorkspace
from granikv.kernels.store_kv import store_kv

__all__ = [
    "CASCADE_CONFIG",
    "DENSE_CONFIG",
    "DecodeConfig",
    "ExtendConfig",
    "ExtendSplitPolicy",
    "PrefixClasses",
    "PrefixConfig",
    "SplitWorkspace",
    "add_rms_norm_",
    "decode_max_splits",
    "decode_paged",
    "extend",
    "extend_splits",
    "merge_lse_",
    "prefix_cascade",
    "prefix_dense",
    "prefix_dense_cublas",
    "rms_norm",
    "rope_",
    "silu_mul",
    "store_kv",
]
