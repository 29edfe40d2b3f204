"""diffusers' shape: from_pretrained with torch_dtype, torch.Generator or int seeds, output types, callbacks,
offload and compile calls, and Kiln's errors as Python exceptions with the C++ messages."""

import numpy as np
import pytest
import torch

import kiln
from conftest import data_path, small_call


def test_torch_generator_and_int_seed_give_the_same_image(tiny_flux):
    by_torch = tiny_flux(**small_call(generator=torch.Generator().manual_seed(7))).images[0]
    by_int = tiny_flux(**small_call(generator=7)).images[0]
    other = tiny_flux(**small_call(generator=8)).images[0]
    assert np.array_equal(np.asarray(by_torch), np.asarray(by_int))
    assert not np.array_equal(np.asarray(by_int), np.asarray(other))



def test_a_torch_generator_continues_as_in_diffusers(tiny_flux):
    """One torch.Generator over two calls: the second continues the stream where the first left it (Kiln hands
    the state back), so two 1-image calls are the two images of one 2-image call; one that has drawn numbers
    before the call continues from there, as diffusers' call would."""
    g = torch.Generator().manual_seed(7)
    first = tiny_flux(**small_call(generator=g), output_type="latent").images
    second = tiny_flux(**small_call(generator=g), output_type="latent").images
    both = tiny_flux(**small_call(generator=7, num_images_per_prompt=2), output_type="latent").images
    torch.testing.assert_close(torch.cat([first, second]), both, rtol=1e-5, atol=1e-6)
    # Where torch itself would be: the noise of two 1-image calls is 2 x 16 x 4 x 4 normals.
    reference = torch.Generator().manual_seed(7)
    torch.randn(2, 16, 4, 4, generator=reference)
    assert torch.equal(g.get_state(), reference.get_state())
    # A generator part-way through its stream, and a list of generators (one per image).
    used = torch.Generator().manual_seed(7)
    torch.randn(3, generator=used)
    other = tiny_flux(**small_call(generator=used)).images[0]
    assert not np.array_equal(np.asarray(other), np.asarray(tiny_flux(**small_call(generator=7)).images[0]))
    listed = tiny_flux(**small_call(generator=[torch.Generator().manual_seed(3), 4], num_images_per_prompt=2)).images
    assert np.array_equal(np.asarray(listed[1]), np.asarray(tiny_flux(**small_call(generator=4)).images[0]))
    with pytest.raises(kiln.RequestError, match="3 generators for 2 images"):
        tiny_flux(**small_call(generator=[1, 2, 3], num_images_per_prompt=2))


def test_dtypes_from_torch_or_strings():
    for dtype in (torch.bfloat16, "bfloat16", "bf16"):
        pipe = kiln.FluxPipeline.from_pretrained(data_path("models", "flux-tiny-dev-bf16"), torch_dtype=dtype)
        assert pipe.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="float32, bfloat16 and float16"):
        kiln.FluxPipeline.from_pretrained(data_path("models", "flux-tiny-dev"), torch_dtype=torch.int8)


def test_output_types(tiny_flux):
    latents = tiny_flux(**small_call(generator=1), output_type="latent").images
    # FLUX's packed latents: [B, (h/2)(w/2), in_channels] for a 32 x 32 image (latents 4 x 4)
    assert isinstance(latents, torch.Tensor) and latents.shape == (1, 4, 64)
    pt = tiny_flux(**small_call(generator=1), output_type="pt").images
    assert isinstance(pt, torch.Tensor) and pt.shape == (1, 3, 32, 32)
    assert tiny_flux(**small_call(generator=1), return_dict=False)[0][0].size == (32, 32)
    with pytest.raises(ValueError, match="output_type"):
        tiny_flux(**small_call(), output_type="jpeg")


def test_callback_sees_and_changes_the_latents_and_can_interrupt(tiny_flux):
    seen = []

    def record(pipe, step, timestep, kwargs):
        seen.append((step, float(timestep), tuple(kwargs["latents"].shape)))
        return kwargs

    plain = tiny_flux(**small_call(generator=2, num_inference_steps=3)).images[0]
    same = tiny_flux(**small_call(generator=2, num_inference_steps=3), callback_on_step_end=record).images[0]
    assert [s[0] for s in seen] == [0, 1, 2] and seen[0][1] > seen[1][1] > seen[2][1]
    assert np.array_equal(np.asarray(plain), np.asarray(same))

    def zero(pipe, step, timestep, kwargs):
        return {"latents": torch.zeros_like(kwargs["latents"])} if step == 1 else kwargs

    changed = tiny_flux(**small_call(generator=2, num_inference_steps=3), callback_on_step_end=zero).images[0]
    assert not np.array_equal(np.asarray(plain), np.asarray(changed))

    steps = []

    def interrupt(pipe, step, timestep, kwargs):
        steps.append(step)
        pipe._interrupt = True
        return kwargs

    tiny_flux(**small_call(generator=2, num_inference_steps=3), callback_on_step_end=interrupt)
    assert steps == [0]


def test_errors_keep_the_cpp_messages(tiny_flux):
    with pytest.raises(kiln.RequestError, match="FluxPipeline takes no negative_prompt_3") as e:
        tiny_flux(**small_call(), negative_prompt_3="blurry")
    assert e.value.field == "negative_prompt_3"
    assert isinstance(e.value, ValueError)
    with pytest.raises(kiln.RequestError, match="height and width must be positive multiples of 16") as e:
        tiny_flux(**small_call(height=40))
    assert e.value.field == "height"
    with pytest.raises(kiln.KilnError, match="pipeline class is 'FluxPipeline', but this is StableDiffusion3Pipeline"):
        kiln.StableDiffusion3Pipeline.from_pretrained(data_path("models", "flux-tiny-dev"))
    # cuda runs through its PJRT plugin: without it (or without PJRT in the build) the error says what to install.
    # On a machine with the plugin the pipeline moves there; this suite then moves it back.
    try:
        tiny_flux.to("cuda")
        assert tiny_flux.device.startswith("cuda")
        tiny_flux.to("cpu")
    except kiln.KilnError as e:
        assert "PJRT: no cuda plugin found. Install it" in str(e) or "has no PJRT support" in str(e), str(e)
    with pytest.raises(TypeError, match="unsupported argument"):
        tiny_flux(**small_call(), eta=0.5)


def test_offload_keeps_the_image():
    pipe = kiln.DiffusionPipeline.from_pretrained(data_path("models", "flux-tiny-dev-bf16"), torch_dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    plain = np.asarray(pipe(**small_call(generator=4)).images[0])
    pipe.enable_model_cpu_offload()
    assert np.array_equal(np.asarray(pipe(**small_call(generator=4)).images[0]), plain)
    pipe.enable_group_offload(onload_device="cpu", num_blocks_per_group=1, use_stream=True)
    assert np.array_equal(np.asarray(pipe(**small_call(generator=4)).images[0]), plain)
    pipe.enable_sequential_cpu_offload()
    assert np.array_equal(np.asarray(pipe(**small_call(generator=4)).images[0]), plain)
    pipe.to("cpu")
    assert np.array_equal(np.asarray(pipe(**small_call(generator=4)).images[0]), plain)


def test_compiled_modes_keep_the_image(tiny_flux):
    from conftest import max_level_difference

    eager = tiny_flux(**small_call(generator=6)).images[0]
    tiny_flux.transformer.compile(fullgraph=True, dynamic=False)
    assert tiny_flux.transformer.is_compiled
    assert max_level_difference(tiny_flux(**small_call(generator=6)).images[0], eager) <= 1
    tiny_flux.transformer.compile_repeated_blocks(fullgraph=True)
    assert max_level_difference(tiny_flux(**small_call(generator=6)).images[0], eager) <= 1
    tiny_flux.configure(mode="eager")  # back to eager for the other tests of the session
    assert not tiny_flux.transformer.is_compiled


def test_a_model_folders_recommended_call_is_what_a_bare_call_takes():
    """models/kiln-shapes-64 carries recommended_call.json: pipe(prompt) makes its 64x64 picture, and the pipeline
    says where its defaults come from."""
    import os

    shapes = os.path.join(os.path.dirname(__file__), "..", "..", "models", "kiln-shapes-64")
    pipe = kiln.DiffusionPipeline.from_pretrained(shapes)
    assert pipe.defaults_source.endswith("recommended_call.json")
    assert pipe.defaults == {"height": 64.0, "width": 64.0, "num_inference_steps": 4.0, "guidance_scale": 0.0,
                             "max_sequence_length": 40.0}
    prompt = "a big white circle on the right, on a black background"
    bare = pipe(prompt, generator=0).images[0]
    written = pipe(prompt, height=64, width=64, num_inference_steps=4, guidance_scale=0.0, max_sequence_length=40,
                   generator=0).images[0]
    assert bare.size == (64, 64)
    assert list(bare.getdata()) == list(written.getdata())
    tiny = kiln.DiffusionPipeline.from_pretrained(data_path("models", "flux-tiny-schnell"))
    assert tiny.defaults_source == "the family's defaults (FluxPipeline)"


def test_a_refused_call_draws_no_progress_bar(tiny_flux, capsys):
    """The call's checks run before its progress bar appears: a refused request prints nothing but the error."""
    tiny_flux.set_progress_bar_config(disable=False)
    try:
        with pytest.raises(kiln.RequestError, match="height"):
            tiny_flux(**small_call(height=40))
        assert "%" not in capsys.readouterr().err
        tiny_flux(**small_call())  # an accepted one still draws it
        assert "%" in capsys.readouterr().err
    finally:
        tiny_flux.set_progress_bar_config(disable=True)
