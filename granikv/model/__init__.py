"""The model: ModelSpec (shapes), the Llama/Qwen2 decoder with injected attention, weights
(seeded random or safetensors), and a float32 reference attention for tests."""

from granikv.model.decoder import AttentionFn, CausalLM
from granikv.model.ref_attention import RefAttention
from granikv.model.spec import ModelSpec, RopeScaling, known_model_names, load_spec
from granikv.model.weights import DummySource, SafetensorsSource, load_model, load_weights, weight_plan

__all__ = [
    "AttentionFn",
    "CausalLM",
    "DummySource",
    "ModelSpec",
    "RefAttention",
    "RopeScaling",
    "SafetensorsSource",
    "known_model_names",
    "load_model",
    "load_spec",
    "load_weights",
    "weight_plan",
]
