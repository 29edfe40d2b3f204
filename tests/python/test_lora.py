"""LoRA from Python with diffusers' calls (load_lora_weights, set_adapters, fuse_lora, unfuse_lora,
unload_lora_weights) gives diffusers' images: the goldens of tools/goldens/lora.py, whose metadata holds the
script of LoRA calls diffusers ran before the pipeline call."""

import numpy as np
import pytest

import kiln
from conftest import data_path, golden, max_level_difference


def replay(pipe, script):
    """Runs a golden's LoRA script ("load FILE NAME; set NAME=W,NAME=W; fuse SCALE; unfuse") with diffusers'
    Python calls."""
    for step in filter(None, (s.strip() for s in script.split(";"))):
        verb, *args = step.split()
        if verb == "load":
            pipe.load_lora_weights(data_path("lora", args[0]), adapter_name=args[1])
        elif verb == "set":
            pairs = [p.split("=") for p in args[0].split(",")]
            pipe.set_adapters([n for n, _ in pairs], adapter_weights=[float(w) for _, w in pairs])
        elif verb == "fuse":
            pipe.fuse_lora(lora_scale=float(args[0]))
        elif verb == "unfuse":
            pipe.unfuse_lora()
        else:
            raise AssertionError(f"unknown step in the golden's script: {step}")


def run(case):
    tensors, m = golden("lora", case + ".safetensors")
    assert m["transformer_file"] == "" and m["dtype"] == "float32"
    pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", m["pipeline"]))
    replay(pipe, m["script"])
    image = pipe(m["prompt"], negative_prompt=m.get("negative_prompt") or None, height=int(m["height"]),
                 width=int(m["width"]), num_inference_steps=int(m["steps"]), guidance_scale=float(m["guidance"]),
                 max_sequence_length=int(m["max_sequence_length"]), generator=int(m["seed"])).images[0]
    return pipe, image, tensors["image_u8"]


@pytest.mark.parametrize("case", ["flux_kohya", "flux_xlabs", "flux_two_adapters_unfused", "flux_two_adapters_fused",
                                  "sd3_two_adapters_fused", "flux2_diffusers"])
def test_lora_matches_diffusers(case):
    _, image, want = run(case)
    assert max_level_difference(image, want) <= 1


def test_adapters_listed_and_unloaded():
    pipe, with_lora, _ = run("flux_two_adapters")
    active = pipe.get_active_adapters()
    assert len(active) == 2
    assert all(set(active) <= set(names) for names in pipe.get_list_adapters().values())
    plain_golden, m = golden("lora", "flux_none.safetensors")
    pipe.unload_lora_weights()
    assert pipe.get_active_adapters() == []
    plain = pipe(m["prompt"], height=int(m["height"]), width=int(m["width"]), num_inference_steps=int(m["steps"]),
                 guidance_scale=float(m["guidance"]), max_sequence_length=int(m["max_sequence_length"]),
                 generator=int(m["seed"])).images[0]
    assert max_level_difference(plain, plain_golden["image_u8"]) <= 1
    assert not np.array_equal(np.asarray(plain), np.asarray(with_lora))


def test_bad_lora_calls_raise_with_the_reason(tmp_path):
    pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", "flux-tiny-schnell"))
    with pytest.raises(kiln.KilnError, match="no_such"):
        pipe.load_lora_weights(str(tmp_path / "no_such.safetensors"))
    with pytest.raises(kiln.KilnError, match="sd3_diffusers.safetensors"):
        pipe.load_lora_weights(data_path("lora", "sd3_diffusers.safetensors"))
    pipe.load_lora_weights(data_path("lora", "flux_diffusers.safetensors"), adapter_name="style")
    with pytest.raises(kiln.KilnError, match="unknown"):
        pipe.set_adapters(["unknown"], [1.0])
    with pytest.raises(ValueError, match="hotswap"):
        pipe.load_lora_weights(data_path("lora", "flux_diffusers.safetensors"), hotswap=True)
