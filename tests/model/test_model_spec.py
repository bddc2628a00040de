"""ModelSpec: the conf/model shapes, HF config.json parsing, and clear errors."""

from __future__ import annotations

import dataclasses
import json

import pytest

from granikv.model import ModelSpec, RopeScaling, known_model_names, load_spec
from granikv.model.spec import CONF_DIR

# Public config.json of meta-llama/Llama-3.1-8B-Instruct (legacy rope keys, as published).
LLAMA31_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "vocab_size": 128256, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}


def same_shapes(a: ModelSpec, b: ModelSpec) -> bool:
    return dataclasses.replace(a, name="", hf_name=None) == dataclasses.replace(b, name="", hf_name=None)


def test_known_names_and_public_shapes():
    assert {"tiny", "tiny-qwen", "llama-3.1-8b", "qwen2.5-14b", "qwen2.5-32b"} <= set(known_model_names())
    llama = load_spec("llama-3.1-8b")
    assert (llama.arch, llama.hidden_size, llama.intermediate_size) == ("llama", 4096, 14336)
    assert llama.num_layers == 32
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim, llama.vocab_size) == (32, 8, 128, 128256)
    assert llama.rope_theta == 500000.0 and llama.rms_norm_eps == 1e-5 and not llama.qkv_bias
    assert llama.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 8192)
    # 128 KiB of K/V per token: docs/design.md, "Numbers to design against"
    assert llama.group_size == 4 and llama.kv_bytes_per_token() == 128 * 1024
    assert llama.eos_token_ids == (128001, 128008, 128009)
    q14, q32 = load_spec("qwen2.5-14b"), load_spec("qwen2.5-32b")
    for q, inter, layers in ((q14, 13824, 48), (q32, 27648, 64)):
        assert (q.arch, q.hidden_size, q.intermediate_size, q.num_layers) == ("qwen2", 5120, inter, layers)
        assert (q.num_heads, q.num_kv_heads, q.head_dim, q.vocab_size) == (40, 8, 128, 152064)
        assert q.qkv_bias and q.rope_theta == 1e6 and q.rope_scaling is None and q.group_size == 5
    assert round(llama.num_params() / 1e9, 2) == 8.03
    assert round(q14.num_params() / 1e9, 1) == 14.8 and round(q32.num_params() / 1e9, 1) == 32.8
    for name in known_model_names():
        spec = load_spec(name)
        assert spec.name == name


def test_tiny_shapes_exercise_the_features():
    tiny, tq = load_spec("tiny"), load_spec("tiny-qwen")
    assert tiny.arch == "llama" and tiny.rope_scaling is not None and tiny.group_size == 4
    assert tq.arch == "qwen2" and tq.qkv_bias and tq.tie_word_embeddings and tq.group_size == 5
    for s in (tiny, tq):
        assert s.vocab_size >= 1024 and s.head_dim == 32
        s.check_tp(2)


def test_from_hf_config_public_llama():
    spec = ModelSpec.from_hf_config(LLAMA31_8B_CONFIG)
    assert same_shapes(spec, load_spec("llama-3.1-8b"))


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen", "llama-3.1-8b", "qwen2.5-14b"])
def test_hf_config_round_trip(name, tmp_path):
    """to_hf_config -> transformers' config class -> saved config.json -> spec is lossless,
    whichever rope key layout the installed transformers writes."""
    from transformers import LlamaConfig, Qwen2Config

    spec = load_spec(name)
    cfg = spec.to_hf_config()
    assert same_shapes(ModelSpec.from_hf_config(cfg), spec)
    (LlamaConfig if spec.arch == "llama" else Qwen2Config)(**cfg).save_pretrained(tmp_path)
    assert same_shapes(load_spec(tmp_path), spec)
    assert same_shapes(load_spec(tmp_path / "config.json"), spec)
    assert load_spec(tmp_path).name == tmp_path.name


def test_yaml_path_and_from_yaml(tmp_path):
    spec = load_spec(CONF_DIR / "tiny.yaml")
    assert spec == ModelSpec.from_yaml(CONF_DIR / "tiny.yaml") == load_spec("tiny")


def test_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="tiny-qwen") as e:
        load_spec("no-such-model")
    assert "no-such-model" in str(e.value)


def test_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_spec(tmp_path)


def test_single_eos_id_and_bad_eos():
    assert ModelSpec.from_hf_config({**LLAMA31_8B_CONFIG, "eos_token_id": 128009}).eos_token_ids == (128009,)
    assert ModelSpec.from_hf_config({**LLAMA31_8B_CONFIG, "eos_token_id": None}).eos_token_ids == ()
    with pytest.raises(ValueError, match="eos"):
        dataclasses.replace(load_spec("tiny"), eos_token_ids=(5000,))


@pytest.mark.parametrize(
    "change, match",
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type"),
        ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, "model_type"),
        ({"attention_bias": True}, "bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 5}, "multiple"),
    ],
)
def test_unsupported_hf_configs_raise(change, match):
    with pytest.raises(ValueError, match=match):
        ModelSpec.from_hf_config({**LLAMA31_8B_CONFIG, **change})


def test_qwen_sliding_window_raises(tmp_path):
    cfg = {**load_spec("tiny-qwen").to_hf_config(), "use_sliding_window": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="sliding"):
        load_spec(tmp_path)


def test_bad_yaml_keys(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text((CONF_DIR / "tiny.yaml").read_text() + "num_experts: 8\n")
    with pytest.raises(ValueError, match="num_experts"):
        ModelSpec.from_yaml(p)


def test_check_tp():
    q14 = load_spec("qwen2.5-14b")
    for tp in (1, 2, 4, 8):
        q14.check_tp(tp)
    with pytest.raises(ValueError, match="num_kv_heads"):
        q14.check_tp(3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        load_spec("tiny").check_tp(4)
    assert q14.kv_bytes_per_token(tp=2) == q14.kv_bytes_per_token() // 2
