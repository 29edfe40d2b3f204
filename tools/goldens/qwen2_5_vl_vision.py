#!/usr/bin/env python3
"""Builds a tiny, randomly initialised Qwen2_5_VLForConditionalGeneration with a vision tower and a Qwen2VLProcessor,
and dumps what Qwen-Image-Edit's prompt encoding computes with an input image, for Kiln's parity tests of the vision
tower, the image processor and the language model reading images.

Outputs (committed; CI never runs this script):
  tests/data/models/qwen2_5_vl-tiny/text_encoder/   save_pretrained's files: a 3-layer language model (hidden 48,
      4 heads of 12, 2 key/value heads, mrope_section [2, 1, 3]) and a 3-block vision tower (hidden 32, 2 heads of 16,
      patch 4, temporal patch 2, merge 2, window_size 24: windows of 3 x 3 merged patches, block 1 full attention),
      every parameter perturbed (norm weights far from one)
  tests/data/models/qwen2_5_vl-tiny/processor/      the Qwen2VLProcessor (patch 4, min_pixels 256, max_pixels 4096)
      with the tiny Qwen tokenizer of tests/data/models/flux2-tiny-text/klein/tokenizer
  tests/data/models/qwen2_5_vl-tiny/images/         the test images (PNG, RGB): a 61x45, big 200x150, small 14x10
  tests/data/goldens/qwen2_5_vl/processor.safetensors   for each image <n> (a, big, small): <n>_pixel_values
      [N, 3 * 2 * 4 * 4] float32 and <n>_grid [1, 3] int64, from the processor as AutoProcessor loads it (metadata
      image_processor: its class, torchvision's when torchvision is installed)
  tests/data/goldens/qwen2_5_vl/<case>.safetensors  cases edit (QwenImageEditPipeline's template, image a) and
      edit_plus (QwenImageEditPlusPipeline's, images a and small): input_ids [1, S], attention_mask [1, S],
      pixel_values, image_grid_thw [n, 3], image_embeds [M, 48] (get_image_features, every image in order),
      position_ids [3, 1, S] (get_rope_index), and the hidden states 0, 1 and 3 (3 = final-normed) twice:
      mrope_hidden_<k> with the 3-D positions (mm_token_type_ids given, as transformers 4 always did) and
      pipeline_hidden_<k> as diffusers 0.42.1 calls transformers 5 (no mm_token_type_ids: positions 0..S-1).
      The edit case also holds bf16_image_embeds and bf16_mrope_hidden_3: the same call with the model in bfloat16.
      Metadata: the prompt text, the drop index.

Usage: PYTHONPATH=<torchvision> python3 tools/goldens/qwen2_5_vl_vision.py (torch, transformers 5, torchvision,
PIL from pip)
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chroma import save_file  # noqa: E402  (the shared golden-writing helper)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "tests", "data", "models", "qwen2_5_vl-tiny")
GOLDENS = os.path.join(ROOT, "tests", "data", "goldens", "qwen2_5_vl")
QWEN_TOKENIZER = os.path.join(ROOT, "tests", "data", "models", "flux2-tiny-text", "klein", "tokenizer")

EDIT_TEMPLATE = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                 "objects, background), then explain how the user's text instruction should alter or modify the "
                 "image. Generate a new image that meets the user's requirements while maintaining consistency with "
                 "the original input where appropriate.<|im_end|>\n<|im_start|>user\n"
                 "<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n")
PLUS_TEMPLATE = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                 "objects, background), then explain how the user's text instruction should alter or modify the "
                 "image. Generate a new image that meets the user's requirements while maintaining consistency with "
                 "the original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
                 "<|im_start|>assistant\n")
PLUS_IMAGE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"
DROP = 64


def make_images():
    """Non-square RGB patterns with detail at every scale, so that resampling errors show."""
    def pattern(w, h, seed):
        y, x = np.mgrid[0:h, 0:w].astype(np.float64)
        rng = np.random.default_rng(seed)
        r = 127.5 + 127.5 * np.sin(x * 0.9 + y * 0.2)
        g = 255.0 * ((x // 3 + y // 2) % 2)
        b = rng.integers(0, 256, (h, w)).astype(np.float64)
        return Image.fromarray(np.stack([r, g, b], -1).round().clip(0, 255).astype(np.uint8), "RGB")
    return {"a": pattern(61, 45, 1), "big": pattern(200, 150, 2), "small": pattern(14, 10, 3)}


def build():
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    tok = AutoTokenizer.from_pretrained(QWEN_TOKENIZER)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
                         max_position_embeddings=2048, rope_scaling={"type": "mrope", "mrope_section": [2, 1, 3]}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=48,
                           patch_size=4, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[1],
                           window_size=24, hidden_act="silu"),
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"))
    torch.manual_seed(1)
    qwen = Qwen2_5_VLForConditionalGeneration(config).eval()
    torch.manual_seed(4)
    with torch.no_grad():
        for name, p in qwen.named_parameters():
            p.add_(torch.randn_like(p) * 0.05)
            if p.dim() == 1 and ("norm" in name or "ln_q" in name):
                p.add_(torch.randn_like(p) * 0.3)  # norm weights far from one: a dropped weight shows
        # The default init (std 0.02) leaves the states nearly independent of the input. Widen it.
        for p in qwen.parameters():
            if p.dim() >= 2:
                p.mul_(5)
    image_processor = Qwen2VLImageProcessor(patch_size=4, temporal_patch_size=2, merge_size=2, min_pixels=256,
                                            max_pixels=4096)
    video_processor = Qwen2VLVideoProcessor(patch_size=4, temporal_patch_size=2, merge_size=2)
    processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=tok, video_processor=video_processor)
    return qwen, processor


def main():
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration, Qwen2VLProcessor

    qwen, processor = build()
    shutil.rmtree(MODEL, ignore_errors=True)
    qwen.save_pretrained(os.path.join(MODEL, "text_encoder"), safe_serialization=True)
    processor.save_pretrained(os.path.join(MODEL, "processor"))
    # The tokenizer files as the klein folder has them, not save_pretrained's (twice the size).
    for name in os.listdir(os.path.join(MODEL, "processor")):
        if name.startswith(("tokenizer", "vocab", "merges", "special_tokens", "added_tokens", "chat_template")):
            os.remove(os.path.join(MODEL, "processor", name))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(QWEN_TOKENIZER, name), os.path.join(MODEL, "processor", name))
    os.makedirs(os.path.join(MODEL, "images"))
    images = make_images()
    for name, im in images.items():
        im.save(os.path.join(MODEL, "images", name + ".png"))
    images = {name: Image.open(os.path.join(MODEL, "images", name + ".png")).convert("RGB") for name in images}

    # As diffusers loads the pipeline's processor folder.
    processor = Qwen2VLProcessor.from_pretrained(os.path.join(MODEL, "processor"))
    auto = AutoProcessor.from_pretrained(os.path.join(MODEL, "processor"))
    ip_class = type(processor.image_processor).__name__
    assert type(auto.image_processor).__name__ == ip_class, (ip_class, type(auto.image_processor).__name__)
    print("image processor:", ip_class)
    shutil.rmtree(GOLDENS, ignore_errors=True)
    os.makedirs(GOLDENS)
    out = {}
    for name, im in images.items():
        r = processor.image_processor(images=[im], return_tensors="pt")
        out[name + "_pixel_values"] = r["pixel_values"].float()
        out[name + "_grid"] = r["image_grid_thw"].long()
        print(name, tuple(r["pixel_values"].shape), r["image_grid_thw"].tolist())
    save_file(out, os.path.join(GOLDENS, "processor.safetensors"), {"image_processor": ip_class})

    model = qwen.model
    cases = [("edit", EDIT_TEMPLATE.format("make the cat wear a red hat"), [images["a"]]),
             ("edit_plus", PLUS_TEMPLATE.format(PLUS_IMAGE.format(1) + PLUS_IMAGE.format(2) + "put them together"),
              [images["a"], images["small"]])]
    for name, text, ims in cases:
        inputs = processor(text=[text], images=ims, padding=True, return_tensors="pt")
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        grid = inputs["image_grid_thw"]
        with torch.no_grad():
            embeds = torch.cat(model.get_image_features(inputs["pixel_values"], grid).pooler_output, 0)
            positions, _ = model.get_rope_index(ids, inputs["mm_token_type_ids"], image_grid_thw=grid,
                                                attention_mask=mask)
            mrope = qwen(input_ids=ids, attention_mask=mask, pixel_values=inputs["pixel_values"],
                         image_grid_thw=grid, mm_token_type_ids=inputs["mm_token_type_ids"],
                         output_hidden_states=True).hidden_states
            # QwenImageEditPipeline._get_qwen_prompt_embeds's call, word for word.
            plain = qwen(input_ids=ids, attention_mask=mask, pixel_values=inputs["pixel_values"],
                         image_grid_thw=grid, output_hidden_states=True).hidden_states
        assert not torch.allclose(mrope[-1], plain[-1]), "the 3-D positions change nothing"
        t = dict(input_ids=ids.long(), attention_mask=mask.long(), pixel_values=inputs["pixel_values"].float(),
                 image_grid_thw=grid.long(), image_embeds=embeds.float(), position_ids=positions.long())
        for k in (0, 1, 3):
            t[f"mrope_hidden_{k}"] = mrope[k].float()
            t[f"pipeline_hidden_{k}"] = plain[k].float()
        if name == "edit":
            # The whole call in bfloat16 (the vision tower's embeddings too), loaded as diffusers loads a bf16
            # pipeline (from_pretrained in bf16: the rotary inv_freq buffers stay float32, which .to(bf16) would
            # round).
            bf16 = Qwen2_5_VLForConditionalGeneration.from_pretrained(os.path.join(MODEL, "text_encoder"),
                                                                      dtype=torch.bfloat16).eval()
            with torch.no_grad():
                t["bf16_image_embeds"] = torch.cat(
                    bf16.model.get_image_features(inputs["pixel_values"], grid).pooler_output, 0).float()
                t["bf16_mrope_hidden_3"] = bf16(
                    input_ids=ids, attention_mask=mask, pixel_values=inputs["pixel_values"], image_grid_thw=grid,
                    mm_token_type_ids=inputs["mm_token_type_ids"], output_hidden_states=True).hidden_states[3].float()
        save_file(t, os.path.join(GOLDENS, name + ".safetensors"), {"prompt": text, "drop_idx": json.dumps(DROP)})
        print(name, tuple(ids.shape), grid.tolist(), "image tokens", int((ids == qwen.config.image_token_id).sum()))


if __name__ == "__main__":
    main()
