// The body of AUTOMATIC1111's `POST /sdapi/v1/txt2img` (and img2img, below) (the API many front-ends speak)
// as Kiln's generation request: prompt, negative_prompt, steps, cfg_scale (the guidance), width, height, seed
// (-1: random), batch_size (images from the prompt), and sampler_name where it maps (Kiln's flow-match Euler
// is "Euler"). The other fields front-ends send are taken at their neutral values (false, 0, empty, the
// default) and refused by name otherwise (a hires fix, restore_faces, a second iteration, a script: what Kiln
// does not do), as is a field A1111 does not have.
#pragma once

#include <string>
#include <string_view>

namespace kiln::serve {

// The generation request body (parse_generation_params' JSON) for an A1111 txt2img body; `model` is the model
// it runs on (A1111 has no model field: its override_settings.sd_model_checkpoint, when given, names it).
// Throws RequestError naming the A1111 field.
std::string a1111_txt2img_body(std::string_view body);

// The same for an A1111 img2img body: txt2img's fields and init_images (base64 PNGs: the first is the image
// to start from), mask (white repaints; inpainting_mask_invert turns it round), denoising_strength (Kiln's
// strength), inpaint_full_res with inpaint_full_res_padding (diffusers' padding_mask_crop: only the region
// around the mask repainted, A1111's default with a mask); resize_mode, mask_blur, inpainting_fill and the
// like at their A1111 defaults only (Kiln binarises the mask, as diffusers does, rather than blurring it).
std::string a1111_img2img_body(std::string_view body);

}  // namespace kiln::serve
