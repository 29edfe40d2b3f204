"""The tiny FLUX.1, SD3.5, FLUX.2, Chroma, Z-Image, SD1.5, SDXL and Qwen-Image pipelines from Python give diffusers' images within one 8-bit level
(float32): the goldens the C++ tests use (tools/goldens/)."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import kiln
from conftest import data_path, golden, max_level_difference


@pytest.mark.parametrize("case", ["schnell_cat_64x64_s0", "dev_cat_64x64_s0", "dev_unicode_80x48_s1234"])
def test_flux_matches_diffusers(case):
    tensors, m = golden("flux", case + ".safetensors")
    pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", m["pipeline"]))
    assert isinstance(pipe, kiln.FluxPipeline)
    image = pipe(m["prompt"], height=int(m["height"]), width=int(m["width"]), num_inference_steps=int(m["steps"]),
                 guidance_scale=float(m["guidance"]), max_sequence_length=int(m["max_sequence_length"]),
                 generator=int(m["seed"])).images[0]
    assert image.size == (int(m["width"]), int(m["height"]))
    assert max_level_difference(image, tensors["image_u8"]) <= 1


@pytest.mark.parametrize("case", ["medium_cat_64x64_s0", "medium_nocfg_64x48_s3", "large_unicode_80x48_s7"])
def test_sd3_matches_diffusers(case):
    tensors, m = golden("sd3", case + ".safetensors")
    pipe = kiln.StableDiffusion3Pipeline.from_pretrained(data_path("models", m["pipeline"]))
    image = pipe(prompt=m["prompt"], negative_prompt=m.get("negative_prompt") or None, height=int(m["height"]),
                 width=int(m["width"]), num_inference_steps=int(m["steps"]), guidance_scale=float(m["guidance"]),
                 max_sequence_length=int(m["max_sequence_length"]), generator=int(m["seed"])).images[0]
    assert max_level_difference(image, tensors["image_u8"]) <= 1


@pytest.mark.parametrize("case", ["dev_retriever_64x64_s0", "dev_ref1_64x48_s3", "klein_cfg_fox_64x64_s0"])
def test_flux2_matches_diffusers(case):
    tensors, m = golden("flux2_e2e", case + ".safetensors")
    cls = kiln.Flux2KleinPipeline if "klein" in m["pipeline"] else kiln.Flux2Pipeline
    pipe = cls.from_pretrained(data_path("models", m["pipeline"]))
    references = [Image.open(data_path("goldens", "flux2", r + ".png")) for r in m["references"].split(",") if r]
    kwargs = dict(negative_prompt=m["negative_prompt"]) if m["cfg"] == "true" else {}
    images = pipe(m["prompt"], image=references or None, height=int(m["height"]) or None,
                  width=int(m["width"]) or None, num_inference_steps=int(m["steps"]),
                  guidance_scale=float(m["guidance"]), max_sequence_length=int(m["max_sequence_length"]),
                  num_images_per_prompt=int(m["num_images_per_prompt"]), generator=int(m["seed"]), **kwargs).images
    expected = tensors["image_u8"]
    expected = expected if expected.ndim == 4 else expected[None]
    assert len(images) == len(expected)
    for image, want in zip(images, expected):
        assert max_level_difference(image, want) <= 1


@pytest.mark.parametrize("case", ["cfg_cat_64x64_s0", "list_64x64_s5", "img2img_64x64_s3"])
def test_chroma_matches_diffusers(case):
    """Chroma's classes come from the registry (kiln/pipelines.py has no code of its own for them)."""
    import json

    tensors, m = golden("chroma", case + ".safetensors")
    pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", m["model"]))
    assert isinstance(pipe, kiln.ChromaPipeline)
    if m["pipeline"] == "ChromaImg2ImgPipeline":
        pipe = kiln.ChromaImg2ImgPipeline.from_pretrained(data_path("models", m["model"]))
    text = lambda key: json.loads(m[key]) if m[key].startswith("[") else m[key]
    kwargs = dict(image=Image.open(data_path("goldens", "flux2", m["image"] + ".png")),
                  strength=float(m["strength"])) if "image" in m else {}
    images = pipe(text("prompt"), negative_prompt=text("negative_prompt"), height=int(m["height"]),
                  width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]),
                  guidance_scale=float(m["guidance_scale"]), max_sequence_length=int(m["max_sequence_length"]),
                  generator=int(m["seed"]), **kwargs).images
    assert len(images) == len(tensors["image_u8"])
    for image, want in zip(images, tensors["image_u8"]):
        assert max_level_difference(image, want) <= 1


@pytest.mark.parametrize("case", ["cfg_norm_trunc_48x80_s2", "list_64x64_s3", "inpaint_80x64_s5"])
def test_z_image_matches_diffusers(case):
    """Z-Image's classes and its own arguments (cfg_normalization=True, cfg_truncation) come from the registry and
    the request's declaration: kiln/pipelines.py has no code of its own for them."""
    import json

    tensors, m = golden("z_image", case + ".safetensors")
    pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", m["model"]))
    assert isinstance(pipe, kiln.ZImagePipeline)
    kwargs = {}
    if m["pipeline"] == "ZImageInpaintPipeline":
        # diffusers' from_pipe: the inpainting class on the loaded pipeline's components.
        source = pipe
        pipe = kiln.ZImageInpaintPipeline.from_pipe(source)
        assert isinstance(pipe, kiln.ZImageInpaintPipeline) and isinstance(source, kiln.ZImagePipeline)
        with pytest.raises(kiln.KilnError, match="FluxImg2ImgPipeline cannot be made from a ZImagePipeline"):
            kiln.FluxImg2ImgPipeline.from_pipe(source)
        kwargs = dict(image=Image.open(data_path("goldens", "flux2", m["image"] + ".png")),
                      mask_image=Image.open(data_path("goldens", "edit", m["mask_image"] + ".png")),
                      strength=float(m["strength"]))
    if "cfg_normalization" in m:
        kwargs.update(cfg_normalization=m["cfg_normalization"] == "true", cfg_truncation=float(m["cfg_truncation"]))
    text = lambda key: json.loads(m[key]) if m[key].startswith("[") else m[key]
    images = pipe(text("prompt"), negative_prompt=m.get("negative_prompt"), height=int(m["height"]),
                  width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]),
                  guidance_scale=float(m["guidance_scale"]), max_sequence_length=int(m["max_sequence_length"]),
                  num_images_per_prompt=int(m.get("num_images_per_prompt", 1)), generator=int(m["seed"]),
                  **kwargs).images
    assert len(images) == len(tensors["image_u8"])
    for image, want in zip(images, tensors["image_u8"]):
        assert max_level_difference(image, want) <= 1


@pytest.mark.parametrize("case", ["cfg_48x80_s1", "list_cfg_64x64_s2", "inpaint_80x64_s5"])
def test_qwen_image_matches_diffusers(case):
    """Qwen-Image's classes and true_cfg_scale come from the registry and the request's declaration:
    kiln/pipelines.py has no code of its own for them."""
    import json

    tensors, m = golden("qwen_image", case + ".safetensors")
    pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", m["model"]))
    assert isinstance(pipe, kiln.QwenImagePipeline)
    kwargs = {}
    if m["pipeline"] == "QwenImageInpaintPipeline":
        pipe = kiln.QwenImageInpaintPipeline.from_pipe(pipe)
        kwargs = dict(image=Image.open(data_path("goldens", "flux2", m["image"] + ".png")),
                      mask_image=Image.open(data_path("goldens", "edit", m["mask_image"] + ".png")),
                      strength=float(m["strength"]))
    if "negative_prompt" in m:
        kwargs.update(negative_prompt=json.loads(m["negative_prompt"]) if m["negative_prompt"].startswith("[")
                      else m["negative_prompt"], true_cfg_scale=float(m["true_cfg_scale"]))
    prompt = json.loads(m["prompt"]) if m["prompt"].startswith("[") else m["prompt"]
    images = pipe(prompt, height=int(m["height"]), width=int(m["width"]),
                  num_inference_steps=int(m["num_inference_steps"]), max_sequence_length=int(m["max_sequence_length"]),
                  num_images_per_prompt=int(m.get("num_images_per_prompt", 1)), generator=int(m["seed"]),
                  **kwargs).images
    assert len(images) == len(tensors["image_u8"])
    for image, want in zip(images, tensors["image_u8"]):
        assert max_level_difference(image, want) <= 1


@pytest.mark.parametrize("folder,case", [("qwen_image_edit", "edit_cfg_48x80_s1"),
                                         ("qwen_image_edit_plus", "plus_2img_64x64_s0")])
def test_qwen_image_edit_matches_diffusers(folder, case):
    """Qwen-Image-Edit and -2509 take their images as `image` (one, or a list), from the registry alone."""
    tensors, m = golden(folder, case + ".safetensors")
    pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", m["model"]))
    assert type(pipe).__name__ == m["pipeline"]
    names = (m["image"] if "image" in m else m["images"]).split(",")
    images = [Image.open(data_path("goldens", "flux2", n + ".png")) for n in names]
    kwargs = dict(negative_prompt=m["negative_prompt"], true_cfg_scale=float(m["true_cfg_scale"])) \
        if "negative_prompt" in m else {}
    out = pipe(m["prompt"], image=images if len(images) > 1 else images[0], height=int(m["height"]),
               width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]), generator=int(m["seed"]),
               **kwargs).images
    assert len(out) == len(tensors["image_u8"])
    for image, want in zip(out, tensors["image_u8"]):
        assert max_level_difference(image, want) <= 1


@pytest.mark.parametrize("case", ["sd15_clipskip1_32x32_s2", "sd15_euler_a_32x32_s7", "sdxl_dpmpp2m_karras_32x32_s5",
                                  "sdxl_micro_cond_32x48_s3", "sd15_inpaint_ref_a_s12"])
def test_stable_diffusion_matches_diffusers(case):
    """The UNet family's classes and arguments (the sampler by name, use_karras_sigmas, clip_skip, SDXL's
    micro-conditioning) come from the registry and the request's declaration, as for every family."""
    import json

    tensors, m = golden("sd", case + ".safetensors")
    pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", m["model"]))
    assert isinstance(pipe, kiln.StableDiffusionXLPipeline if "sdxl" in case else kiln.StableDiffusionPipeline)
    kwargs = {"scheduler": m["scheduler"]}
    kwargs.update(json.loads(m.get("scheduler_kwargs", "{}")))
    for key in ("original_size", "target_size", "crops_coords_top_left", "negative_original_size",
                "negative_target_size", "negative_crops_coords_top_left"):
        if key in m:
            kwargs[key] = json.loads(m[key])
    if "clip_skip" in m:
        kwargs["clip_skip"] = int(m["clip_skip"])
    if m["pipeline"] == "StableDiffusionInpaintPipeline":
        pipe = kiln.StableDiffusionInpaintPipeline.from_pipe(pipe)
        kwargs.update(image=Image.open(data_path("goldens", "flux2", m["image"] + ".png")),
                      mask_image=Image.open(data_path("goldens", "edit", m["mask_image"] + ".png")),
                      strength=float(m["strength"]))
    images = pipe(m["prompt"], negative_prompt=m.get("negative_prompt"), height=int(m["height"]),
                  width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]),
                  guidance_scale=float(m["guidance_scale"]),
                  num_images_per_prompt=int(m.get("num_images_per_prompt", 1)), generator=int(m["seed"]),
                  **kwargs).images
    assert len(images) == len(tensors["image_u8"])
    for image, want in zip(images, tensors["image_u8"]):
        assert max_level_difference(image, want) <= 1


@pytest.mark.parametrize("case", ["handoff_euler_48x40_s0", "handoff_dpmpp2m_32x32_s1", "handoff_inpaint_ref_a_40x48_s2"])
def test_sdxl_hand_off_in_latents_matches_diffusers(case):
    """diffusers' documented ensemble of expert denoisers, as written: the base's output_type="latent" at
    denoising_end, given to the refiner as its image with denoising_start (tools/goldens/sd_handoff.py)."""
    tensors, m = golden("sd_handoff", case + ".safetensors")
    base = getattr(kiln, m["base_pipeline"]).from_pretrained(data_path("models", m["base_model"]))
    refiner = getattr(kiln, m["pipeline"]).from_pretrained(data_path("models", m["model"]))
    for pipe in (base, refiner):
        pipe.set_progress_bar_config(disable=True)
        if "scheduler" in m:
            pipe.scheduler = getattr(kiln, m["scheduler"]).from_config(pipe.scheduler.config)
    call = dict(prompt=m["prompt"], negative_prompt=m.get("negative_prompt"), height=int(m["height"]),
                width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]),
                guidance_scale=float(m["guidance_scale"]))
    if "mask_image" in m:
        call.update(image=Image.open(data_path("goldens", "flux2", m["image"] + ".png")),
                    mask_image=Image.open(data_path("goldens", "edit", m["mask_image"] + ".png")))
    fraction = float(m["denoising_end"])
    latents = base(**call, denoising_end=fraction, output_type="latent", generator=int(m["seed"])).images
    assert tuple(latents.shape) == tensors["base_latents"].shape
    assert np.abs(np.asarray(latents) - tensors["base_latents"]).max() <= 1e-4 * np.abs(tensors["base_latents"]).max()
    image = refiner(**dict(call, image=latents), denoising_start=fraction, generator=int(m["seed"])).images[0]
    assert max_level_difference(image, tensors["image_u8"][0]) <= 1


def test_a_sampler_swapped_as_diffusers_scripts_do_gives_diffusers_image():
    """pipe.scheduler = X.from_config(pipe.scheduler.config, ...), with Kiln's classes and with diffusers' own."""
    import diffusers

    tensors, m = golden("sd", "sdxl_dpmpp2m_karras_32x32_s5.safetensors")
    pipe = kiln.StableDiffusionXLPipeline.from_pretrained(data_path("models", m["model"]))
    assert type(pipe.scheduler).__name__ == "EulerDiscreteScheduler"  # the folder's
    call = dict(height=int(m["height"]), width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]),
                guidance_scale=float(m["guidance_scale"]))
    for sampler in (kiln.DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, use_karras_sigmas=True),
                    diffusers.DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, use_karras_sigmas=True)):
        pipe.scheduler = sampler
        image = pipe(m["prompt"], generator=int(m["seed"]), **call).images[0]
        assert max_level_difference(image, tensors["image_u8"][0]) <= 1
        assert image.info["scheduler"] == "DPMSolverMultistepScheduler, karras"
    with pytest.raises(TypeError, match="Kiln runs"):
        pipe.scheduler = diffusers.UniPCMultistepScheduler.from_config(pipe.scheduler.config)
    flux = kiln.DiffusionPipeline.from_pretrained(data_path("models", "flux-tiny-schnell"))
    with pytest.raises(TypeError, match="runs its own schedule"):
        flux.scheduler = kiln.EulerDiscreteScheduler()


def test_stable_diffusion_lora_matches_diffusers():
    """load_lora_weights / set_adapters on SD1.5 and fuse_lora on SDXL, diffusers' layout (tools/goldens/sd_lora.py)."""
    for model in ("sd15", "sdxl"):
        tensors, m = golden("sd", f"lora_{model}.safetensors")
        pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", m["model"]))
        pipe.load_lora_weights(data_path("lora", f"{model}_diffusers.safetensors"), adapter_name="sd")
        script = m["script"]
        if "set sd=" in script:
            pipe.set_adapters(["sd"], [float(script.split("set sd=")[1])])
        if "fuse " in script:
            pipe.fuse_lora(lora_scale=float(script.split("fuse ")[1]))
        image = pipe(m["prompt"], height=int(m["height"]), width=int(m["width"]),
                     num_inference_steps=int(m["num_inference_steps"]), guidance_scale=float(m["guidance_scale"]),
                     generator=int(m["seed"])).images[0]
        assert max_level_difference(image, tensors["image_u8"][0]) <= 1, model


def test_np_and_pil_outputs_agree(tiny_flux):
    from conftest import small_call

    pil = tiny_flux(**small_call(generator=5)).images[0]
    array = tiny_flux(**small_call(generator=5), output_type="np").images
    assert array.dtype == np.float32 and array.shape == (1, 32, 32, 3)
    assert 0.0 <= array.min() and array.max() <= 1.0
    # diffusers' numpy_to_pil: round(x * 255)
    assert np.array_equal(np.asarray(pil), np.round(array[0] * 255).astype(np.uint8))


@pytest.mark.parametrize("case", ["flux_img2img_64x64_s3", "sd3_img2img_64x64_s5", "flux_inpaint_64x64_s4",
                                  "sd3_inpaint_64x64_s8", "flux_fill_64x64_s9", "kontext_own_size_48x80_s11",
                                  "sd3_inpaint_crop_64x48_s12"])
def test_editing_pipelines_match_diffusers(case):
    tensors, m = golden("edit", case + ".safetensors")
    cls = getattr(kiln, m["pipeline"])
    pipe = cls.from_pretrained(data_path("models", m["model"]))
    kwargs = dict(image=Image.open(data_path("goldens", "flux2", m["image"] + ".png")), height=int(m["height"]),
                  width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]),
                  max_sequence_length=int(m["max_sequence_length"]), generator=int(m["seed"]))
    if "mask_image" in m:
        kwargs["mask_image"] = Image.open(data_path("goldens", "edit", m["mask_image"] + ".png"))
    for key in ("strength", "guidance_scale"):
        if key in m:
            kwargs[key] = float(m[key])
    if "negative_prompt" in m:
        kwargs["negative_prompt"] = m["negative_prompt"]
    for key in ("max_area", "padding_mask_crop"):
        if key in m:
            kwargs[key] = int(m[key])
    if "_auto_resize" in m:
        kwargs["_auto_resize"] = m["_auto_resize"] == "True"
    image = pipe(m["prompt"], **kwargs).images[0]
    # (With padding_mask_crop the result is pasted back into the image, whose size it has: the shapes are compared.)
    assert max_level_difference(image, tensors["image_u8"]) <= 1


@pytest.mark.parametrize("case", ["flux_dev_64x64_s21", "flux_schnell_prompt2_48x80_s22", "flux_inpaint_64x64_s25",
                                  "kontext_s26"])
def test_flux_true_cfg_matches_diffusers(case):
    """FLUX.1's true classifier-free guidance: true_cfg_scale with negative_prompt (and negative_prompt_2)."""
    tensors, m = golden("true_cfg", case + ".safetensors")
    pipe = getattr(kiln, m["pipeline"]).from_pretrained(data_path("models", m["model"]))
    kwargs = dict(negative_prompt=m["negative_prompt"], true_cfg_scale=float(m["true_cfg_scale"]),
                  height=int(m["height"]), width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]),
                  guidance_scale=float(m["guidance_scale"]), max_sequence_length=int(m["max_sequence_length"]),
                  generator=int(m["seed"]))
    for key in ("prompt_2", "negative_prompt_2"):
        if key in m:
            kwargs[key] = m[key]
    if "image" in m:
        kwargs["image"] = Image.open(data_path("goldens", "flux2", m["image"] + ".png"))
    if "mask_image" in m:
        kwargs["mask_image"] = Image.open(data_path("goldens", "edit", m["mask_image"] + ".png"))
    if "strength" in m:
        kwargs["strength"] = float(m["strength"])
    if "max_area" in m:
        kwargs["max_area"] = int(m["max_area"])
    image = pipe(m["prompt"], **kwargs).images[0]
    assert max_level_difference(image, tensors["image_u8"]) <= 1


@pytest.mark.parametrize("case", [
    "flux_dev_2x2_s31", "flux_dev_true_cfg_s32", "sd3_cfg_2x2_s33", "klein_cfg_3x1_s34", "flux2_dev_2x1_s35",
    "flux_dev_generators_1x3", "sd3_generators_2x1", "flux2_dev_generators_1x2", "flux_dev_drawn_generator",
    "flux_dev_embeds_s44", "sd3_embeds_s45", "flux_img2img_lists", "flux_inpaint_lists", "kontext_lists",
    "sd3_inpaint_lists"])
def test_lists_generators_and_embeddings_match_diffusers(case):
    """diffusers' prompt=[...] and negative_prompt=[...], generator=[...] (one per image), a torch.Generator that
    has drawn numbers before the call (left where diffusers' call leaves it), and prompt_embeds with
    pooled_prompt_embeds instead of prompts, in the text-to-image and editing pipelines."""
    import json

    tensors, m = golden("prompt_lists", case + ".safetensors")
    pipe = getattr(kiln, m["pipeline"]).from_pretrained(data_path("models", m["model"]))
    pipe.set_progress_bar_config(disable=True)
    as_list = lambda v: json.loads(v) if v.startswith("[") else v  # noqa: E731
    kwargs = dict(height=int(m["height"]), width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]),
                  guidance_scale=float(m["guidance_scale"]), max_sequence_length=int(m["max_sequence_length"]),
                  num_images_per_prompt=int(m.get("num_images_per_prompt", 1)))
    if "seeds" in m:
        kwargs["generator"] = [torch.Generator().manual_seed(s) for s in json.loads(m["seeds"])]
    else:
        kwargs["generator"] = torch.Generator().manual_seed(int(m["seed"]))
        if "generator_state" in tensors:
            kwargs["generator"].set_state(torch.from_numpy(tensors["generator_state"].copy()))
    for key in ("prompt", "negative_prompt"):
        if key in m:
            kwargs[key] = as_list(m[key])
    for key in ("true_cfg_scale", "strength"):
        if key in m:
            kwargs[key] = float(m[key])
    if "max_area" in m:
        kwargs["max_area"] = int(m["max_area"])
    if "_auto_resize" in m:
        kwargs["_auto_resize"] = m["_auto_resize"] == "True"
    if "image" in m:
        kwargs["image"] = Image.open(data_path("goldens", "flux2", m["image"] + ".png"))
    if "mask_image" in m:
        kwargs["mask_image"] = Image.open(data_path("goldens", "edit", m["mask_image"] + ".png"))
    for key in ("prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"):
        if key in tensors:
            kwargs[key] = torch.from_numpy(tensors[key].copy())
    images = pipe(**kwargs).images
    assert len(images) == len(tensors["image_u8"])
    for image, want in zip(images, tensors["image_u8"]):
        assert max_level_difference(image, want) <= 1
    if "generator_state_after" in tensors:
        assert np.array_equal(kwargs["generator"].get_state().numpy(), tensors["generator_state_after"])


@pytest.mark.parametrize("diffusers_config", [False, True])
def test_first_block_cache_matches_diffusers(diffusers_config):
    """pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold)), Kiln's config class or diffusers' own:
    diffusers' image (tools/goldens/step_cache.py), the reused steps in the image's text; a call's cache="none"
    turns it off."""
    tensors, m = golden("step_cache", "fbc_flux_dev_64x64_s31.safetensors")
    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", m["model"]))
    threshold = float(m["cache"].split(":")[1])
    if diffusers_config:
        from diffusers.hooks import FirstBlockCacheConfig
    else:
        from kiln import FirstBlockCacheConfig
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    call = dict(prompt=m["prompt"], height=int(m["height"]), width=int(m["width"]),
                num_inference_steps=int(m["num_inference_steps"]), guidance_scale=float(m["guidance_scale"]),
                max_sequence_length=int(m["max_sequence_length"]), generator=int(m["seed"]))
    image = pipe(**call).images[0]
    assert max_level_difference(image, tensors["image_u8"]) <= 1
    reused = [str(i + 1) for i, c in enumerate(tensors["computed"].tolist()) if not c]
    assert image.info["cache"] == m["cache"] and image.info["cache_reused"] == ",".join(reused)
    plain = pipe(**call, cache="none").images[0]
    assert "cache" not in plain.info and max_level_difference(plain, tensors["image_u8"]) > 1
    with pytest.raises(kiln.RequestError, match="fbcache:THRESHOLD"):
        pipe(**call, cache="fbcache:lots")


def test_mag_cache_matches_diffusers():
    """MagCache through diffusers' own MagCacheConfig (FLUX_MAG_RATIOS, resampled to the call's 20 steps by
    diffusers and again, to the same, by Kiln): diffusers' image and reused steps."""
    from diffusers.hooks import MagCacheConfig
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    tensors, m = golden("step_cache", "mag_flux_dev_64x64_s41.safetensors")
    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", m["model"]))
    steps = int(m["num_inference_steps"])
    pipe.transformer.enable_cache(MagCacheConfig(threshold=0.06, mag_ratios=FLUX_MAG_RATIOS, num_inference_steps=steps))
    image = pipe(prompt=m["prompt"], height=int(m["height"]), width=int(m["width"]), num_inference_steps=steps,
                 guidance_scale=float(m["guidance_scale"]), max_sequence_length=int(m["max_sequence_length"]),
                 generator=int(m["seed"])).images[0]
    assert max_level_difference(image, tensors["image_u8"]) <= 1
    reused = [str(i + 1) for i, c in enumerate(tensors["computed"].tolist()) if not c]
    assert image.info["cache_reused"] == ",".join(reused)


def test_taylorseer_matches_diffusers():
    """TaylorSeer through diffusers' own TaylorSeerCacheConfig (float32 factors of order 2, a cool-down, true
    CFG): diffusers' image; a lite-mode config, which Kiln does not have, is refused by name."""
    from diffusers.hooks import TaylorSeerCacheConfig

    tensors, m = golden("step_cache", "taylor_flux_dev_true_cfg_64x64_s52.safetensors")
    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", m["model"]))
    pipe.transformer.enable_cache(TaylorSeerCacheConfig(cache_interval=3, disable_cache_before_step=2, max_order=2,
                                                        taylor_factors_dtype=torch.float32,
                                                        disable_cache_after_step=10))
    image = pipe(prompt=m["prompt"], negative_prompt=m["negative_prompt"], true_cfg_scale=float(m["true_cfg_scale"]),
                 height=int(m["height"]), width=int(m["width"]), num_inference_steps=int(m["num_inference_steps"]),
                 guidance_scale=float(m["guidance_scale"]), max_sequence_length=int(m["max_sequence_length"]),
                 generator=int(m["seed"])).images[0]
    assert max_level_difference(image, tensors["image_u8"]) <= 1
    assert image.info["cache"] == m["cache"]
    with pytest.raises(ValueError, match="lite mode"):
        pipe.transformer.enable_cache(TaylorSeerCacheConfig(use_lite_mode=True))


def _attention_cache_call(m):
    return dict(prompt=m["prompt"], height=int(m["height"]), width=int(m["width"]),
                num_inference_steps=int(m["num_inference_steps"]), guidance_scale=float(m["guidance_scale"]),
                max_sequence_length=int(m["max_sequence_length"]), generator=int(m["seed"]))


def _share_within_one_level(image, want):
    return float(np.mean(np.abs(np.asarray(image).astype(np.int32) - want.astype(np.int32)) <= 1))


@pytest.mark.parametrize("diffusers_config", [False, True])
def test_pyramid_attention_broadcast_cache_matches_diffusers(diffusers_config):
    """pipe.transformer.enable_cache(PyramidAttentionBroadcastConfig(...)), Kiln's class or diffusers' own (whose
    current_timestep_callback Kiln does not need): diffusers' image (tools/goldens/step_cache_attention.py) and
    reused steps; settings Kiln's transformers have nothing for, and true CFG, are refused by name."""
    tensors, m = golden("step_cache_attention", "pab_flux_dev_64x64_s91.safetensors")
    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", m["model"]))
    if diffusers_config:
        from diffusers import PyramidAttentionBroadcastConfig
    else:
        from kiln import PyramidAttentionBroadcastConfig
    pipe.transformer.enable_cache(PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(100, 800),
        current_timestep_callback=lambda: None))
    call = _attention_cache_call(m)
    image = pipe(**call).images[0]
    assert _share_within_one_level(image, tensors["image_u8"]) >= 0.99
    reused = [str(i + 1) for i, c in enumerate(tensors["computed"].tolist()) if not c]
    assert image.info["cache"] == m["cache"] and image.info["cache_reused"] == ",".join(reused)
    with pytest.raises(kiln.RequestError, match="Pyramid Attention Broadcast with classifier-free guidance whose negative prompt"):
        pipe(**call, negative_prompt="blurry", true_cfg_scale=3.0)
    with pytest.raises(ValueError, match="temporal_attention_block_skip_range has nothing to act on"):
        pipe.transformer.enable_cache(PyramidAttentionBroadcastConfig(temporal_attention_block_skip_range=2))
    if diffusers_config:
        with pytest.raises(ValueError, match="other identifiers are not in Kiln"):
            pipe.transformer.enable_cache(PyramidAttentionBroadcastConfig(spatial_attention_block_identifiers=("attn",)))


def test_faster_cache_matches_diffusers():
    """FasterCache, guidance-distilled: diffusers' own FasterCacheConfig(is_guidance_distilled=True) with its
    defaults, and Kiln's with another weight, skip range and timestep range, give diffusers' images; the
    unconditional-branch form (diffusers' default is_guidance_distilled=False) and a weight callback are refused
    by name."""
    from diffusers import FasterCacheConfig as DiffusersFasterCacheConfig

    tensors, m = golden("step_cache_attention", "faster_flux_dev_64x64_s95.safetensors")
    pipe = kiln.FluxPipeline.from_pretrained(data_path("models", m["model"]))
    pipe.transformer.enable_cache(DiffusersFasterCacheConfig(is_guidance_distilled=True,
                                                             current_timestep_callback=lambda: None))
    image = pipe(**_attention_cache_call(m)).images[0]
    assert _share_within_one_level(image, tensors["image_u8"]) >= 0.99
    assert image.info["cache"] == m["cache"]

    tensors, m = golden("step_cache_attention", "faster_flux_dev_w03_64x64_s96.safetensors")
    pipe.transformer.enable_cache(kiln.FasterCacheConfig(spatial_attention_block_skip_range=3,
                                                         spatial_attention_timestep_skip_range=(200, 900),
                                                         attention_weight=0.3))
    image = pipe(**_attention_cache_call(m)).images[0]
    assert _share_within_one_level(image, tensors["image_u8"]) >= 0.99
    assert image.info["cache"] == m["cache"]

    with pytest.raises(ValueError, match="is_guidance_distilled=False is not in Kiln"):
        pipe.transformer.enable_cache(DiffusersFasterCacheConfig())
    with pytest.raises(ValueError, match="is_guidance_distilled=False is not in Kiln"):
        pipe.transformer.enable_cache(kiln.FasterCacheConfig(is_guidance_distilled=False))
    with pytest.raises(ValueError, match="attention_weight_callback is not in Kiln"):
        pipe.transformer.enable_cache(DiffusersFasterCacheConfig(is_guidance_distilled=True,
                                                                 attention_weight_callback=lambda _: 0.3))
