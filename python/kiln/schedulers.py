"""diffusers' samplers for the UNet family (Stable Diffusion 1.x/2.x, SDXL), as their scripts swap them::

    pipe.scheduler = EulerAncestralDiscreteScheduler.from_config(pipe.scheduler.config)
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config, use_karras_sigmas=True)

Kiln builds the sampler from the pipeline folder's scheduler_config.json, as diffusers' from_config builds it from
`pipe.scheduler.config` (the keys the folder's file sets carry over, the others take the new class's defaults);
`use_karras_sigmas` is the one argument a swap may add. diffusers' own scheduler objects are accepted too (by class
name and their use_karras_sigmas). A call's `scheduler=` / `use_karras_sigmas=` keywords win over the assignment.
"""

import json
import os


class _Sampler:
    """A sampler Kiln runs, by its diffusers class name; `config` is the folder's scheduler config it starts from."""

    def __init__(self, config=None, use_karras_sigmas=None):
        self.config = dict(config or {})
        if use_karras_sigmas is not None:
            self.config["use_karras_sigmas"] = bool(use_karras_sigmas)
        self._use_karras_sigmas = use_karras_sigmas

    @classmethod
    def from_config(cls, config, use_karras_sigmas=None, **kwargs):
        """diffusers' from_config(pipe.scheduler.config, ...): only use_karras_sigmas may be added."""
        if kwargs:
            raise TypeError(f"{cls.__name__}.from_config: Kiln builds the sampler from the pipeline folder's config; "
                            f"{', '.join(sorted(kwargs))} cannot be set (use_karras_sigmas can)")
        return cls(dict(config or {}), use_karras_sigmas)

    def __repr__(self):
        return f"{type(self).__name__}(use_karras_sigmas={self._use_karras_sigmas})"


class EulerDiscreteScheduler(_Sampler):
    pass


class EulerAncestralDiscreteScheduler(_Sampler):
    pass


class DPMSolverMultistepScheduler(_Sampler):
    pass


class DDIMScheduler(_Sampler):
    pass


class PNDMScheduler(_Sampler):
    pass


SAMPLERS = {cls.__name__: cls for cls in (EulerDiscreteScheduler, EulerAncestralDiscreteScheduler,
                                          DPMSolverMultistepScheduler, DDIMScheduler, PNDMScheduler)}


def folder_sampler(model_path):
    """The folder's own sampler: its class, its scheduler_config.json as `config` (None when it has none)."""
    path = os.path.join(model_path, "scheduler", "scheduler_config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        # diffusers writes DPM-Solver's lambda_min_clipped as -Infinity, which Python's json reads.
        config = json.load(f)
    cls = SAMPLERS.get(config.get("_class_name"))
    return cls(config) if cls is not None else None


def call_fields(sampler):
    """The request fields that run `sampler` (Kiln's or diffusers' object): scheduler and use_karras_sigmas."""
    name = type(sampler).__name__
    if name not in SAMPLERS:
        raise TypeError(f"pipe.scheduler: Kiln runs {', '.join(SAMPLERS)}; got {name}")
    fields = {"scheduler": name}
    config = getattr(sampler, "config", None) or {}
    karras = config.get("use_karras_sigmas") if hasattr(config, "get") else getattr(config, "use_karras_sigmas", None)
    if karras is not None:
        fields["use_karras_sigmas"] = bool(karras)
    return fields
