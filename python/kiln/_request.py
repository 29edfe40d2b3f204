"""diffusers' keyword arguments as Kiln's request fields, read from the one declaration of the request
(kiln/pipelines/request_fields.h, through kiln._kiln.request_fields()): each argument is converted by its
field's kind, a list given where diffusers takes `str | list[str]` goes to the field's list form (prompt ->
prompts, generator -> generators), and an argument no field has is refused by name."""

from . import _convert
from ._kiln import request_fields as _native_request_fields

_FIELDS = _native_request_fields()
_BY_KEYWORD = {f["keyword"]: f for f in _FIELDS}
_BY_NAME = {f["name"]: f for f in _FIELDS}


def keywords():
    """Every keyword argument a pipeline call may take."""
    return sorted(_BY_KEYWORD)


def _value(field, value):
    kind = field["kind"]
    if kind == "image":
        return _convert.image_array(value)
    if kind == "image list":
        return [_convert.image_array(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    if kind == "tensor":
        return _convert.to_kiln(value)
    if kind == "generator":
        return _convert.generator_value(value)
    if kind == "generator list":
        return [_convert.generator_value(v) for v in value]
    if kind in ("text list", "integer list"):
        return list(value)
    if kind == "number" and isinstance(value, bool):
        return float(value)  # Python's bool is a number (diffusers' cfg_normalization=True is 1)
    return value


def _is_latents(value):
    """diffusers' image-to-image and inpainting take an `image` of 4 channels [B, 4, h, w] as latents (SDXL's
    hand-off: the base's output_type="latent" output), not as pixels."""
    shape = getattr(value, "shape", None)
    return shape is not None and len(shape) == 4 and shape[1] == 4


def native_fields(arguments):
    """{field name: value of its kind} for the native call, from {keyword: value} (None: left unset). Raises
    TypeError naming the arguments no field takes."""
    unknown = sorted(k for k, v in arguments.items() if v is not None and k not in _BY_KEYWORD)
    if unknown:
        raise TypeError(f"unsupported argument(s) {', '.join(unknown)} (Kiln's pipelines take "
                        f"{', '.join(keywords())})")
    fields = {}
    for keyword, value in arguments.items():
        if value is None:
            continue
        if keyword == "image" and _is_latents(value):
            fields["image_latents"] = _convert.to_kiln(value)
            continue
        field = _BY_KEYWORD[keyword]
        if field["list_form"] and isinstance(value, (list, tuple)):
            if len(value) != 1:  # diffusers' list: the field's list form
                fields[field["list_form"]] = _value(_BY_NAME[field["list_form"]], value)
                continue
            value = value[0]
        fields[field["name"]] = _value(field, value)
    return fields
