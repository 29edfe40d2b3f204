"""Names and shapes of the real FLUX.2 text encoders, from transformers' own classes on the meta device.

    python3 tools/goldens/flux2_text_real_layouts.py

Reads tools/goldens/flux2_text_real_configs.json (where each value comes from is stated there), builds
Mistral3ForConditionalGeneration and Qwen3ForCausalLM with those configs on the meta device (no memory), and writes
tests/data/goldens/flux2_text/real_layouts.json: per component its config and {tensor name: shape} of the
state_dict (the module tree's names, model.language_model.* for Mistral 3), plus the parameter counts.
"""
import json
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "tools", "goldens", "flux2_text_real_configs.json")
OUT = os.path.join(ROOT, "tests", "data", "goldens", "flux2_text", "real_layouts.json")


def build(config):
    from transformers import AutoConfig, Mistral3ForConditionalGeneration, Qwen3ForCausalLM
    cfg = dict(config)
    model_type = cfg.pop("model_type")
    cls = Mistral3ForConditionalGeneration if model_type == "mistral3" else Qwen3ForCausalLM
    c = AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        return cls(c)


def main():
    configs = json.load(open(CONFIGS))
    out = {"configs": {}, "layouts": {}, "parameters": {}}
    for name, config in configs.items():
        if name.startswith("_"):
            continue
        model = build(config)
        state = model.state_dict()
        out["configs"][name] = config
        out["layouts"][name] = {k: list(v.shape) for k, v in state.items()}
        out["parameters"][name] = {
            "all": sum(p.numel() for p in model.parameters()),
            "language_model": sum(v.numel() for k, v in state.items()
                                  if "vision" not in k and "projector" not in k and "lm_head" not in k),
        }
        print(name, out["parameters"][name], len(state))
    with open(OUT, "w") as f:
        json.dump(out, f, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
