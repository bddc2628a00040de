"""Fixtures for the model tests: tiny Hugging Face reference models saved as checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from granikv.model import ModelSpec


def build_hf_model(spec: ModelSpec, seed: int = 0, qk_scale: float = 4.0):
    """A float32 transformers model of `spec` with random weights that exercise every path:
    norm weights off 1, non-zero q/k/v biases, and q/k scaled up so attention is peaked (with
    HF's 0.02 init it is nearly uniform, which would hide RoPE and masking errors)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if spec.arch == "llama":
        config_cls, model_cls = LlamaConfig, LlamaForCausalLM
    else:
        config_cls, model_cls = Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    model = model_cls(config_cls(**spec.to_hf_config())).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            if "q_proj" in name or "k_proj" in name:
                p.mul_(qk_scale)
    return model


@pytest.fixture
def hf_checkpoint(tmp_path: Path):
    """make(spec, sharded=True) -> (hf_model, checkpoint_dir) saved with safetensors
    (sharded: many small files plus model.safetensors.index.json)."""

    def make(spec: ModelSpec, sharded: bool = True, seed: int = 0):
        model = build_hf_model(spec, seed=seed)
        path = tmp_path / f"{spec.name}-ckpt"
        model.save_pretrained(path, max_shard_size="300KB" if sharded else "1GB")
        return model, path

    return make
