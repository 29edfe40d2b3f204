"""diffusers' pipeline classes, over Kiln's C++ pipelines (kiln._kiln.Pipeline).

The names, arguments and defaults are diffusers'. What differs: one prompt per call (num_images_per_prompt for
several images), a generator that is an int seed or a fresh torch.Generator, and devices: `pipe.to("xla-cpu")`,
`pipe.to("cuda")` or `pipe.to("tpu")` run every component on a device reached through a PJRT plugin, in any execution
mode (`pipe.vae.to(...)` moves one component); a device without its plugin installed is refused with what to install. Calls release the GIL, may come from several threads
(each gets the image it would get alone), and Ctrl-C cancels a call within one denoising step.
"""

import dataclasses
import os

from . import _convert, _kiln, _request, schedulers as _schedulers
from ._kiln import Pipeline as _Pipeline


class PipelineOutput:
    """diffusers' output: `.images` (PIL images, a float32 array [B, H, W, 3], or a torch tensor [B, 3, H, W],
    by output_type; the latents for output_type="latent")."""

    def __init__(self, images):
        self.images = images

    def __getitem__(self, index):
        return (self.images,)[index]

    def __repr__(self):
        return f"PipelineOutput(images={self.images!r})"


@dataclasses.dataclass
class FirstBlockCacheConfig:
    """diffusers' FirstBlockCacheConfig: the blocks after the first run only when the first block's residual
    changed by more than `threshold` (relative) since the last step that ran them."""

    threshold: float = 0.05


@dataclasses.dataclass
class MagCacheConfig:
    """diffusers' MagCacheConfig: the blocks skipped while the error the magnitude ratios accumulate stays
    within `threshold` (at most `max_skip_steps` in a row, none in the first `retention_ratio` of the steps).
    `mag_ratios`: the checkpoint's (None: diffusers' FLUX_MAG_RATIOS); `calibrate`: measure them instead (the
    image's info["mag_ratios"]). `num_inference_steps` is the call's in Kiln."""

    threshold: float = 0.06
    max_skip_steps: int = 3
    retention_ratio: float = 0.2
    num_inference_steps: int = 28
    mag_ratios: list = None
    calibrate: bool = False


@dataclasses.dataclass
class TaylorSeerCacheConfig:
    """diffusers' TaylorSeerCacheConfig (its default identifiers: every attention of the blocks): computed at the
    first `disable_cache_before_step` steps and one in `cache_interval` (and from `disable_cache_after_step`),
    forecast by a Taylor series of order `max_order` in between, its factors kept in `taylor_factors_dtype`
    ("bfloat16" or "float32", or torch's)."""

    cache_interval: int = 5
    disable_cache_before_step: int = 3
    disable_cache_after_step: int = None
    max_order: int = 1
    taylor_factors_dtype: object = "bfloat16"


@dataclasses.dataclass
class PyramidAttentionBroadcastConfig:
    """diffusers' PyramidAttentionBroadcastConfig, its spatial part (every attention of the blocks): an attention
    runs at its first step, whenever the timestep (the scheduler's t; Kiln knows it, so no
    `current_timestep_callback` is needed) is not strictly inside `spatial_attention_timestep_skip_range`, and at
    one step in `spatial_attention_block_skip_range`; at the others its last outputs are reused. None: diffusers'
    fallback, 2. The temporal and cross-attention parts have nothing to act on in Kiln's transformers (joint
    self-attentions, no temporal attention): setting them is refused."""

    spatial_attention_block_skip_range: int = None
    temporal_attention_block_skip_range: int = None
    cross_attention_block_skip_range: int = None
    spatial_attention_timestep_skip_range: tuple = (100, 800)
    current_timestep_callback: object = None


@dataclasses.dataclass
class FasterCacheConfig:
    """diffusers' FasterCacheConfig in its guidance-distilled form (is_guidance_distilled=True, Kiln's default,
    the only form Kiln has: the unconditional-branch approximation needs a batch-concatenated CFG call and an
    image-shaped transformer output): inside `spatial_attention_timestep_skip_range` an attention runs at one
    step in `spatial_attention_block_skip_range` and is extrapolated from its last two outputs in between,
    t + (t - t_2) * `attention_weight` (diffusers' attention_weight_callback's default constant, 0.5)."""

    spatial_attention_block_skip_range: int = 2
    spatial_attention_timestep_skip_range: tuple = (-1, 681)
    attention_weight: float = 0.5
    is_guidance_distilled: bool = True
    current_timestep_callback: object = None


# diffusers' default identifiers (hooks/_common.py, hooks/faster_cache.py): every attention of the blocks, the
# only ones Kiln's attention caches act on.
_PAB_SPATIAL_IDENTIFIERS = ("blocks", "transformer_blocks", "single_transformer_blocks", "layers",
                            "visual_transformer_blocks")
_FASTER_SPATIAL_IDENTIFIERS = ("^blocks.*attn", "^transformer_blocks.*attn", "^single_transformer_blocks.*attn")


def _timestep_range(name, value):
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"enable_cache: {name} must be two timesteps (low, high), got {value!r}") from None
    return f"{low!r},{high!r}"


def _attention_cache_spec(config):
    """The spec of a Pyramid Attention Broadcast or FasterCache config, Kiln's or diffusers'; what Kiln cannot
    honour refused by name."""
    pab = type(config).__name__ == "PyramidAttentionBroadcastConfig"
    name = "Pyramid Attention Broadcast" if pab else "FasterCache"
    if pab:
        for other in ("temporal_attention_block_skip_range", "cross_attention_block_skip_range"):
            if getattr(config, other, None) is not None:
                raise ValueError(f"enable_cache: {name}'s {other} has nothing to act on in Kiln: FLUX.1's and "
                                 f"Qwen-Image's attentions are joint self-attentions, and they have no temporal "
                                 f"attention; set spatial_attention_block_skip_range")
        identifiers = getattr(config, "spatial_attention_block_identifiers", _PAB_SPATIAL_IDENTIFIERS)
        if tuple(identifiers) != _PAB_SPATIAL_IDENTIFIERS:
            raise ValueError(f"enable_cache: Kiln's {name} acts on every attention of the blocks (diffusers' default "
                             f"spatial_attention_block_identifiers); other identifiers are not in Kiln")
        skip = config.spatial_attention_block_skip_range
        skip = 2 if skip is None else skip  # diffusers' fallback when no skip range is set
        window = _timestep_range("spatial_attention_timestep_skip_range", config.spatial_attention_timestep_skip_range)
        return f"pab:skip={int(skip)}:range={window}"
    if not getattr(config, "is_guidance_distilled", True):
        raise ValueError("enable_cache: FasterCache with is_guidance_distilled=False is not in Kiln: its "
                         "unconditional-branch approximation needs a batch-concatenated classifier-free-guidance "
                         "call and an image-shaped (B, C, H, W) transformer output, and Kiln's transformers output "
                         "packed tokens and run true CFG's branches as two calls; pass is_guidance_distilled=True "
                         "(the attention part, for guidance-distilled models such as FLUX.1)")
    if getattr(config, "temporal_attention_block_skip_range", None) is not None:
        raise ValueError("enable_cache: FasterCache's temporal_attention_block_skip_range has nothing to act on in "
                         "Kiln: its transformers have no temporal attention")
    identifiers = getattr(config, "spatial_attention_block_identifiers", _FASTER_SPATIAL_IDENTIFIERS)
    if tuple(identifiers) != _FASTER_SPATIAL_IDENTIFIERS:
        raise ValueError(f"enable_cache: Kiln's {name} acts on every attention of the blocks (diffusers' default "
                         f"spatial_attention_block_identifiers); other identifiers are not in Kiln")
    weight = getattr(config, "attention_weight", 0.5)
    if getattr(config, "attention_weight_callback", None) is not None:
        raise ValueError("enable_cache: FasterCache's attention_weight_callback is not in Kiln (it may read the "
                         "module and the step, which Kiln's engine cannot call back into); its weight is a constant: "
                         "kiln.FasterCacheConfig(attention_weight=...), default 0.5 as diffusers'")
    window = _timestep_range("spatial_attention_timestep_skip_range", config.spatial_attention_timestep_skip_range)
    return f"fastercache:skip={int(config.spatial_attention_block_skip_range)}:range={window}:weight={float(weight)!r}"


def _step_cache_spec(config):
    """The spec Kiln's engine reads ("fbcache:0.12") of a cache config, Kiln's or diffusers' (by its class
    name, so that diffusers need not be imported here)."""
    if type(config).__name__ == "FirstBlockCacheConfig":
        return f"fbcache:{float(config.threshold)!r}"
    if type(config).__name__ == "TaylorSeerCacheConfig":
        if getattr(config, "skip_predict_identifiers", None) or getattr(config, "cache_identifiers", None) or \
                getattr(config, "use_lite_mode", False):
            raise ValueError("enable_cache: Kiln's TaylorSeer forecasts every attention of the blocks (diffusers' "
                             "default identifiers); other identifiers and lite mode are not in Kiln")
        factors = _convert.dtype_name(config.taylor_factors_dtype)
        if factors not in ("bfloat16", "float32"):
            raise ValueError(f"enable_cache: TaylorSeer keeps its factors in bfloat16 or float32, not {factors}")
        spec = (f"taylorseer:interval={int(config.cache_interval)}:warmup={int(config.disable_cache_before_step)}"
                f":order={int(config.max_order)}")
        if config.disable_cache_after_step is not None:
            spec += f":until={int(config.disable_cache_after_step)}"
        return spec + (":factors=f32" if factors == "float32" else "")
    if type(config).__name__ == "MagCacheConfig":
        if config.calibrate:
            return "magcache:calibrate"
        spec = (f"magcache:{float(config.threshold)!r}:max_skip={int(config.max_skip_steps)}"
                f":retention={float(config.retention_ratio)!r}")
        if config.mag_ratios is not None:
            spec += ":ratios=" + ",".join(repr(float(r)) for r in list(config.mag_ratios))
        return spec
    if type(config).__name__ in ("PyramidAttentionBroadcastConfig", "FasterCacheConfig"):
        return _attention_cache_spec(config)
    if isinstance(config, str):
        return config
    raise TypeError(f"enable_cache: Kiln has diffusers' FirstBlockCacheConfig, MagCacheConfig, "
                    f"TaylorSeerCacheConfig, PyramidAttentionBroadcastConfig and FasterCacheConfig; got "
                    f"{type(config).__name__}")


class _Transformer:
    """`pipe.transformer`, for the compiled modes: `.compile(...)` (torch.nn.Module.compile's arguments) and
    `.compile_repeated_blocks(...)`."""

    def __init__(self, pipe):
        self._pipe = pipe

    def compile(self, *args, fullgraph=False, dynamic=None, backend=None, mode=None, options=None, **kwargs):
        # Kiln compiles for its own backend whatever `backend` names; shapes are static (dynamic=False), as
        # TorchTPU requires: a new size compiles once.
        self._pipe._native.compile_transformer(fullgraph=bool(fullgraph), dynamic=bool(dynamic))

    def compile_repeated_blocks(self, *args, **kwargs):
        self._pipe._native.compile_repeated_blocks()

    @property
    def is_compiled(self):
        return self._pipe._native.is_compiled

    def enable_cache(self, config):
        """diffusers' transformer.enable_cache(config): kiln.FirstBlockCacheConfig or diffusers' own
        (diffusers.hooks.FirstBlockCacheConfig); every call then uses it unless its `cache` says otherwise."""
        self._pipe._native.enable_cache(_step_cache_spec(config))

    def disable_cache(self):
        self._pipe._native.disable_cache()

    def to(self, device, *args, **kwargs):
        self._pipe._native.component_to("transformer", str(device))
        return self


class _Vae:
    def __init__(self, pipe):
        self._pipe = pipe

    def enable_tiling(self, tile_sample_min_size=None, **kwargs):
        self._pipe._native.enable_vae_tiling(int(tile_sample_min_size or 0))

    def disable_tiling(self):
        self._pipe._native.disable_vae_tiling()

    def to(self, device, *args, **kwargs):
        self._pipe._native.component_to("vae", str(device))
        return self


_CLASSES = {}


class DiffusionPipeline:
    """Loads the pipeline class a model's model_index.json names (`DiffusionPipeline.from_pretrained`), or, from a
    subclass, that class."""

    def __init__(self, native):
        self._native = native
        self.transformer = _Transformer(self)
        self.vae = _Vae(self)
        self._progress_config = {}
        self._interrupt = False
        self._sampler = None  # set by `pipe.scheduler = ...` (the UNet family)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _CLASSES[cls.__name__] = cls

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, torch_dtype=None, dtype=None, revision=None,
                        transformer_file=None, packed_weight_budget=None, tensor_parallel=1, **kwargs):
        """diffusers' from_pretrained: a diffusers folder or a repo id in the local Hugging Face cache.
        `torch_dtype` (or `dtype`, diffusers' newer name): torch.bfloat16 or "bfloat16", float32 by default."""
        expected = "" if cls is DiffusionPipeline else cls.__name__
        native = _Pipeline.from_pretrained(
            str(pretrained_model_name_or_path), dtype=_convert.dtype_name(dtype if dtype is not None else torch_dtype),
            revision=revision or "", transformer_file=str(transformer_file or ""),
            packed_weight_budget=packed_weight_budget, tensor_parallel=tensor_parallel, expected_class=expected)
        return _CLASSES.get(native.class_name, DiffusionPipeline)(native)

    @classmethod
    def from_pipe(cls, pipeline, **kwargs):
        """diffusers' from_pipe: this class holding `pipeline`'s components, nothing loaded again (the same
        weights, LoRA adapters and compiled programs; a call to either waits for the other's):
        `FluxImg2ImgPipeline.from_pipe(pipe)`. A class of another family, or one that loads its own checkpoint
        (Fill, Kontext), is refused by name."""
        if cls is DiffusionPipeline:
            raise TypeError("from_pipe makes a named class: e.g. FluxImg2ImgPipeline.from_pipe(pipe)")
        if kwargs:
            raise TypeError(f"from_pipe: Kiln's shares every component; {', '.join(sorted(kwargs))} cannot be "
                            "replaced")
        return cls(_Pipeline.from_pipe(pipeline._native, cls.__name__))

    # ---- what diffusers' pipelines have
    @property
    def dtype(self):
        torch = _convert.torch_module()
        return getattr(torch, self._native.dtype) if torch is not None else self._native.dtype

    @property
    def device(self):
        return self._native.device

    @property
    def interrupt(self):
        return self._interrupt

    def to(self, *args, **kwargs):
        device = kwargs.get("device", args[0] if args else None)
        if device is not None:
            self._native.to(str(device))
        return self

    def enable_model_cpu_offload(self, gpu_id=None, device=None):
        self._native.enable_model_cpu_offload(None if device is None else str(device))

    def enable_sequential_cpu_offload(self, gpu_id=None, device=None):
        self._native.enable_sequential_cpu_offload(0)

    def enable_group_offload(self, onload_device=None, offload_device=None, offload_type="block_level",
                             num_blocks_per_group=1, use_stream=True, **kwargs):
        if offload_type != "block_level":
            raise ValueError(f"enable_group_offload: Kiln offloads blocks (offload_type='block_level'), "
                             f"got {offload_type!r}")
        self._native.enable_group_offload(int(num_blocks_per_group), bool(use_stream),
                                          None if onload_device is None else str(onload_device))

    def enable_vae_tiling(self):
        self._native.enable_vae_tiling(0)

    def disable_vae_tiling(self):
        self._native.disable_vae_tiling()

    def set_progress_bar_config(self, **kwargs):
        self._progress_config = kwargs

    # ---- LoRA (diffusers' LoraLoaderMixin): diffusers/PEFT, kohya, Black Forest Labs and XLabs files
    def load_lora_weights(self, pretrained_model_name_or_path_or_dict, adapter_name=None, weight_name=None,
                          ignore_mismatches=False, **kwargs):
        """Loads a LoRA file (or `weight_name` in a folder, default pytorch_lora_weights.safetensors) as the
        adapter `adapter_name` (default "default_<n>"), which becomes the active one at weight 1. A file that does
        not fit the pipeline fails naming its first mismatch unless `ignore_mismatches`."""
        if kwargs.pop("hotswap", False):
            raise ValueError("hotswap: not supported by Kiln (load another adapter and call set_adapters)")
        kwargs.pop("low_cpu_mem_usage", None)
        if kwargs:
            raise TypeError(f"load_lora_weights: unexpected arguments {sorted(kwargs)}")
        if isinstance(pretrained_model_name_or_path_or_dict, dict):
            raise TypeError("load_lora_weights: a state dict is not supported; give the path of a .safetensors file")
        path = os.fspath(pretrained_model_name_or_path_or_dict)
        if os.path.isdir(path):
            path = os.path.join(path, weight_name or "pytorch_lora_weights.safetensors")
        self._native.load_lora_weights(path, adapter_name or "", bool(ignore_mismatches))

    def set_adapters(self, adapter_names, adapter_weights=None):
        names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
        if adapter_weights is None:
            weights = []
        elif isinstance(adapter_weights, (int, float)):
            weights = [float(adapter_weights)] * len(names)
        else:
            weights = [float(w) for w in adapter_weights]
        self._native.set_adapters(names, weights)

    def fuse_lora(self, components=None, lora_scale=1.0, safe_fusing=False, adapter_names=None, **kwargs):
        if adapter_names is not None:
            self.set_adapters(adapter_names)
        self._native.fuse_lora(float(lora_scale), list(components or []))

    def unfuse_lora(self, components=None, **kwargs):
        self._native.unfuse_lora()

    def unload_lora_weights(self, **kwargs):
        self._native.unload_lora_weights()

    def delete_adapters(self, adapter_names):
        self._native.delete_adapters([adapter_names] if isinstance(adapter_names, str) else list(adapter_names))

    def get_active_adapters(self):
        return self._native.get_active_adapters()

    def get_list_adapters(self):
        return self._native.get_list_adapters()

    # ---- Kiln's own
    def configure(self, mode=None, offload=None, blocks_per_group=1, max_memory=None, device=None):
        """Kiln's execution mode ("eager", "fuse", "compile", "compile-blocks") and offload ("none", "model",
        "group", "sequential", or a `max_memory` in bytes that picks it), where the components compute
        (`device`: "xla-cpu", "cuda", "tpu"; offloaded onto it, or moved there); returns what was chosen."""
        return self._native.configure(mode=mode, offload=offload, blocks_per_group=blocks_per_group,
                                      max_memory=max_memory, device=None if device is None else str(device))

    def set_memory_budget(self, bytes, device=None):
        """The coarsest offload whose weights fit in `bytes`; on a `device` with memory of its own, `bytes`
        holds each call's activations too (their estimate is kept free). Returns the plan, in words."""
        return self._native.set_memory_budget(int(bytes), None if device is None else str(device))

    @property
    def defaults(self):
        return self._native.defaults()

    @property
    def defaults_source(self):
        """Where defaults() comes from: the model folder's recommended_call.json, or the family's defaults."""
        return self._native.defaults_source()

    # ---- the sampler (the UNet family)
    @property
    def scheduler(self):
        """The sampler calls run: the one assigned, else the folder's (None for a family whose schedule is not
        a choice, such as the flow-matching transformers)."""
        return self._sampler or _schedulers.folder_sampler(self._native.model_path)

    @scheduler.setter
    def scheduler(self, sampler):
        info = next(i for i in _kiln.pipeline_class_info() if i["name"] == self._native.class_name)
        if "scheduler" not in info["fields"]:
            raise TypeError(f"{self._native.class_name} runs its own schedule; samplers are the UNet family's")
        _schedulers.call_fields(sampler)  # refuses a class Kiln does not have, now rather than at the call
        self._sampler = sampler

    # ---- the call
    def __call__(self, prompt=None, *, output_type="pil", return_dict=True, callback_on_step_end=None,
                 callback_on_step_end_tensor_inputs=None, **kwargs):
        """diffusers' __call__: the keyword arguments are the request fields the pipeline class takes (see
        kiln.pipeline_class_info()); one it does not take is refused naming it (kiln.RequestError)."""
        if output_type not in ("pil", "np", "pt", "latent"):
            raise ValueError(f'output_type must be "pil", "np", "pt" or "latent", got {output_type!r}')
        if self._sampler is not None:
            kwargs = {**_schedulers.call_fields(self._sampler), **kwargs}
        fields = _request.native_fields({"prompt": prompt, **kwargs})
        # torch's "pt" is the float array, handed over as a tensor.
        fields["output_type"] = "np" if output_type == "pt" else output_type
        want_torch = output_type == "pt" or (output_type == "latent" and _convert.torch_module() is not None)
        self._interrupt = False
        # A request the pipeline refuses fails before a progress bar is drawn.
        self._native.check(fields)
        steps = kwargs.get("num_inference_steps") or int(self._native.defaults()["num_inference_steps"])
        bar = self._progress_bar(steps)
        torch_latents = _convert.torch_module() is not None

        def on_step(step, num_steps, timestep, latents):
            if bar is not None:
                bar.update(1)
            if callback_on_step_end is None:
                return self._interrupt or None
            given = _convert.from_kiln(latents, torch_latents)
            result = callback_on_step_end(self, step, timestep, {"latents": given})
            returned = (result or {}).get("latents", given)
            if self._interrupt:
                return True
            return None if returned is given else _convert.to_kiln(returned)

        try:
            out = self._native.generate(
                fields, on_step=on_step if (bar is not None or callback_on_step_end is not None) else None,
                widen_bfloat16=_convert.torch_module() is None)
        finally:
            if bar is not None:
                bar.close()
        _convert.hand_back(kwargs.get("generator"), out)
        result = self._images(out, output_type, want_torch)
        return PipelineOutput(result) if return_dict else (result,)

    # ---- helpers
    def _progress_bar(self, total):
        if self._progress_config.get("disable", False):
            return None
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return None
        return tqdm(total=total, **{k: v for k, v in self._progress_config.items() if k != "disable"})

    @staticmethod
    def _images(out, output_type, want_torch):
        if output_type == "latent":
            return _convert.from_kiln(out["latents"], want_torch)
        if output_type == "np":
            return _convert.from_kiln(out["array"], False)
        if output_type == "pt":
            return _convert.from_kiln(out["array"], True).permute(0, 3, 1, 2)
        from PIL import Image  # output_type="pil" needs Pillow, as in diffusers

        images = []
        for pixels, metadata in out["images"]:
            picture = Image.fromarray(pixels, "RGB")
            picture.info.update(metadata)  # prompt, seed, steps, ...: what `kiln generate` writes as PNG text
            images.append(picture)
        return images


def _pipeline_classes():
    """One class per pipeline class of the registry (kiln/pipelines/pipeline_registry.h), named as diffusers
    names it: `from kiln import FluxPipeline` is diffusers' import."""
    made = {}
    for info in _kiln.pipeline_class_info():
        doc = (f"{info['name']}: the {info['family']} family's {info['task']} pipeline, as diffusers' "
               f"{info['name']}; its call takes {', '.join(sorted(info['fields']))}.")
        made[info["name"]] = type(info["name"], (DiffusionPipeline,), {"__doc__": doc, "__module__": __name__})
    return made


globals().update(_pipeline_classes())
__all__ = ["DiffusionPipeline", "FasterCacheConfig", "FirstBlockCacheConfig", "MagCacheConfig", "PipelineOutput",
           "PyramidAttentionBroadcastConfig", "TaylorSeerCacheConfig",
           *sorted(_CLASSES)]
