"""Tiny FLUX.2 text encoders of the real transformers classes, and diffusers' prompt embeddings from them.

    PYTHONPATH=<dir with torchvision> python3 tools/goldens/flux2_text.py

(PixtralProcessor imports torchvision; `pip install --target DIR --no-deps torchvision` is enough for the text path.)
Run tools/goldens/flux2_tokenizers.py first: the tokenizers it writes are part of these pipeline folders.

Writes, under tests/data/:
  models/flux2-tiny-text/dev/{model_index.json, text_encoder/}    Mistral3ForConditionalGeneration (text + a tiny
                                                                  Pixtral tower), saved by save_pretrained
  models/flux2-tiny-text/dev-model-prefix/text_encoder/           the same weights under the in-memory names of
                                                                  transformers >= 4.52 (model.language_model.*,
                                                                  model.vision_tower.*, lm_head.weight); save_pretrained
                                                                  writes the original ones (language_model.model.*)
  models/flux2-tiny-text/klein/{model_index.json, text_encoder/}  Qwen3ForCausalLM (tied embeddings, as Qwen3-4B)
  goldens/flux2_text/{dev,klein}.safetensors and cases.json       per case: input ids and mask, every hidden state,
                                                                  prompt_embeds and text_ids from
                                                                  Flux2Pipeline._get_mistral_3_small_prompt_embeds /
                                                                  Flux2KleinPipeline._get_qwen3_prompt_embeds and
                                                                  _prepare_text_ids; f32, and bf16 for one case
"""
import json
import os

import torch
from safetensors.torch import save_file, load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
MODELS = os.path.join(DATA, "models", "flux2-tiny-text")
GOLDENS = os.path.join(DATA, "goldens", "flux2_text")

PROMPTS = [
    "a golden retriever surfing a wave at sunset",
    "",
    "Crème brûlée, 一只猫 🐶 [IMG] don't",
    "a lighthouse on a cliff above a stormy sea, waves crashing, dramatic clouds, volumetric light, film grain, "
    "highly detailed, cinematic composition, seagulls",
]
# (max_sequence_length, text_encoder_out_layers): the tiny models have 5 layers, so index 5 is the final-normed
# output (hidden_states[-1]) and 1..4 raw layer outputs.
CASES = [(64, (1, 3, 4)), (48, (2, 4, 5)), (16, (1, 2, 3))]


def randomize(model, seed):
    # Larger than the default 0.02 init, so every layer changes the states measurably.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name or "norm" in name.split(".")[-2]:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g) / max(1.0, p.shape[-1] ** 0.5) * 4)


def model_index(cls):
    return {"_class_name": cls, "_diffusers_version": "0.42.1",
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "text_encoder": ["transformers", "Mistral3ForConditionalGeneration" if cls == "Flux2Pipeline"
                             else "Qwen3ForCausalLM"],
            "tokenizer": ["transformers", "PixtralProcessor" if cls == "Flux2Pipeline" else "Qwen2TokenizerFast"],
            "transformer": ["diffusers", "Flux2Transformer2DModel"],
            "vae": ["diffusers", "AutoencoderKLFlux2"]}


# The tiny decoders' sizes (keyword overrides give the deeper ones of tools/goldens/flux2_e2e.py).
TINY_DECODER = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=5, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16)


def make_mistral(vocab_size, **sizes):
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig
    text = MistralConfig(vocab_size=vocab_size, **{**TINY_DECODER, **sizes}, rms_norm_eps=1e-5,
                         rope_theta=1e9, max_position_embeddings=1024, sliding_window=None,
                         tie_word_embeddings=False)
    vision = PixtralVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 head_dim=8, image_size=28, patch_size=14)
    config = Mistral3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), spatial_merge_size=2,
                            image_token_index=10, projector_hidden_act="gelu", multimodal_projector_bias=False,
                            vision_feature_layer=-1)
    torch.manual_seed(0)
    model = Mistral3ForConditionalGeneration(config).eval()
    randomize(model, 1)
    return model


def make_qwen(vocab_size, **sizes):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(vocab_size=vocab_size, **{**TINY_DECODER, **sizes}, rms_norm_eps=1e-6,
                         rope_theta=1e6, max_position_embeddings=1024, tie_word_embeddings=True,
                         attention_bias=False, use_sliding_window=False)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    randomize(model, 2)
    return model


def model_prefix_name(name):
    # save_pretrained writes language_model.{model.*, lm_head.weight}, vision_tower.*, multi_modal_projector.*; the
    # module tree (and files saved from its state_dict) has model.{language_model, vision_tower,
    # multi_modal_projector}.* and lm_head.weight.
    if name.startswith("language_model.model."):
        return "model.language_model." + name[len("language_model.model."):]
    if name == "language_model.lm_head.weight":
        return "lm_head.weight"
    return "model." + name


def run_cases(family, model, tokenizer, dtype=torch.float32, cases=CASES):
    from diffusers.pipelines.flux2.pipeline_flux2 import Flux2Pipeline, format_input
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    model = model.to(dtype)
    tensors, meta = {}, []
    for i, (max_len, layers) in enumerate(cases):
        with torch.no_grad():
            if family == "dev":
                embeds = Flux2Pipeline._get_mistral_3_small_prompt_embeds(
                    model, tokenizer, PROMPTS, max_sequence_length=max_len, system_message=SYSTEM_MESSAGE,
                    hidden_states_layers=layers)
                inputs = tokenizer.apply_chat_template(
                    format_input(PROMPTS, SYSTEM_MESSAGE), add_generation_prompt=False, tokenize=True,
                    return_dict=True, return_tensors="pt", padding="max_length", truncation=True, max_length=max_len)
                ids, mask = inputs["input_ids"], inputs["attention_mask"]
            else:
                embeds = Flux2KleinPipeline._get_qwen3_prompt_embeds(
                    model, tokenizer, PROMPTS, max_sequence_length=max_len, hidden_states_layers=layers)
                rows = []
                for p in PROMPTS:
                    text = tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                         add_generation_prompt=True, enable_thinking=False)
                    rows.append(tokenizer(text, return_tensors="pt", padding="max_length", truncation=True,
                                          max_length=max_len))
                ids = torch.cat([r["input_ids"] for r in rows])
                mask = torch.cat([r["attention_mask"] for r in rows])
            out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
            text_ids = Flux2Pipeline._prepare_text_ids(embeds)
        tensors[f"case{i}_input_ids"] = ids.contiguous()
        tensors[f"case{i}_attention_mask"] = mask.contiguous()
        tensors[f"case{i}_prompt_embeds"] = embeds.contiguous()
        tensors[f"case{i}_text_ids"] = text_ids.contiguous()
        for k, h in enumerate(out.hidden_states):
            tensors[f"case{i}_hidden_{k}"] = h.contiguous()
        meta.append({"max_sequence_length": max_len, "layers": list(layers), "dtype": str(dtype)})
    return tensors, meta


def main():
    from transformers import AutoProcessor, AutoTokenizer
    dev_tok = AutoProcessor.from_pretrained(os.path.join(MODELS, "dev", "tokenizer"))
    klein_tok = AutoTokenizer.from_pretrained(os.path.join(MODELS, "klein", "tokenizer"))

    mistral = make_mistral(len(dev_tok.tokenizer))
    mistral.save_pretrained(os.path.join(MODELS, "dev", "text_encoder"))
    json.dump(model_index("Flux2Pipeline"), open(os.path.join(MODELS, "dev", "model_index.json"), "w"), indent=2)
    legacy = os.path.join(MODELS, "dev-model-prefix", "text_encoder")
    os.makedirs(legacy, exist_ok=True)
    state = load_file(os.path.join(MODELS, "dev", "text_encoder", "model.safetensors"))
    save_file({model_prefix_name(k): v for k, v in state.items()}, os.path.join(legacy, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(MODELS, "dev", "text_encoder", "config.json")) as f:
        open(os.path.join(legacy, "config.json"), "w").write(f.read())

    qwen = make_qwen(len(klein_tok))
    qwen.save_pretrained(os.path.join(MODELS, "klein", "text_encoder"))
    json.dump(model_index("Flux2KleinPipeline"), open(os.path.join(MODELS, "klein", "model_index.json"), "w"),
              indent=2)

    os.makedirs(GOLDENS, exist_ok=True)
    meta = {"prompts": PROMPTS}
    for family, model, tok in (("dev", mistral, dev_tok), ("klein", qwen, klein_tok)):
        tensors, cases = run_cases(family, model, tok)
        bf16, bf16_cases = run_cases(family, model, tok, torch.bfloat16, cases=CASES[:1])
        tensors.update({"bf16_" + k: v for k, v in bf16.items() if "hidden" not in k})
        save_file(tensors, os.path.join(GOLDENS, family + ".safetensors"))
        meta[family] = {"cases": cases, "bf16_cases": bf16_cases}
        model.to(torch.float32)
    json.dump(meta, open(os.path.join(GOLDENS, "cases.json"), "w", encoding="utf-8"), indent=2, ensure_ascii=False)
    assert sorted(model_prefix_name(k) for k in state) == sorted(k for k in mistral.state_dict() if k != "lm_head.weight")
    print("state dict keys (dev):", sorted(state)[:3], "...", len(state))
    print("state dict keys (klein):", sorted(load_file(os.path.join(MODELS, "klein", "text_encoder",
                                                                    "model.safetensors")))[:3])


if __name__ == "__main__":
    main()
