"""transformers/peft scenarios: GPT-2 and Llama bases, GPT-2 + LoRA, Mistral and Qwen2 (Llama derivatives).

Small configurations (no downloads), fixed seeds: the same model every run.
"""

from __future__ import annotations

import torch


def build_hf(name: str):
    """(model, example input, rebuild recipe) for transformers/peft models from small configs."""
    import transformers

    transformers.logging.set_verbosity_error()
    if name == "gpt2":
        torch.manual_seed(10)
        cfg = transformers.GPT2Config(
            n_layer=2, n_head=2, n_embd=32, vocab_size=101, n_positions=32, bos_token_id=0, eos_token_id=0
        )
        return transformers.GPT2LMHeadModel(cfg).eval(), torch.randint(0, 101, (1, 9))
    if name == "llama":
        torch.manual_seed(11)
        cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=97, max_position_embeddings=64, bos_token_id=0,
                                       eos_token_id=0, pad_token_id=0)  # fmt: skip
        return transformers.LlamaForCausalLM(cfg).eval(), torch.randint(0, 97, (1, 11))
    if name in ("mistral", "qwen2"):  # real third-party derivatives of the Llama architecture
        torch.manual_seed(13)
        common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      vocab_size=97, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)  # fmt: skip
        if name == "mistral":
            cfg = transformers.MistralConfig(sliding_window=None, **common)
            return transformers.MistralForCausalLM(cfg).eval(), torch.randint(0, 97, (1, 11))
        cfg = transformers.Qwen2Config(**common)
        return transformers.Qwen2ForCausalLM(cfg).eval(), torch.randint(0, 97, (1, 11))
    if name == "lora":
        import peft

        base, ids = build_hf("gpt2")
        torch.manual_seed(12)
        lcfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, fan_in_fan_out=True)
        model = peft.get_peft_model(base, lcfg).eval()
        with torch.no_grad():  # non-zero LoRA B so the adapter changes outputs
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
        return model, ids
    raise KeyError(name)


HF = ["gpt2", "llama", "lora", "mistral", "qwen2"]
BASES = ["gpt2", "llama"]  # in the library; the others are derivatives: lora of gpt2, mistral and qwen2 of llama
