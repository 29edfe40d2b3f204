#include "cli/serve/a1111_params.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/serve/base64.h"
#include "cli/serve/generation_params.h"
#include "kiln/core/error.h"

namespace kiln::serve {

namespace {

using nlohmann::json;

// A name from the body as printable text: JSON-quoted (control characters and NULs escaped, invalid UTF-8
// replaced), its first 40 bytes.
std::string printable(const std::string& s) {
  const std::string shown =
      json(s.size() > 40 ? s.substr(0, 40) : s).dump(-1, ' ', false, json::error_handler_t::replace);
  return shown.substr(1, shown.size() - 2) + (s.size() > 40 ? "..." : "");
}

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw RequestError(field, field.empty() ? why : printable(field) + ": " + why);
}

// A value that asks for nothing: what front-ends send for the features they leave off.
bool neutral(const json& v) {
  if (v.is_null()) return true;
  if (v.is_boolean()) return !v.get<bool>();
  if (v.is_number()) return v.get<double>() == 0.0;
  if (v.is_string()) return v.get<std::string>().empty();
  if (v.is_array() || v.is_object()) return v.empty();
  return false;
}

// Fields A1111's txt2img has that Kiln does not do: each taken only at its neutral value, or at the value
// named here (A1111's own default for it).
const std::map<std::string, json>& unsupported_defaults() {
  static const std::map<std::string, json> fields = {{"styles", json::array()},
                                                     {"subseed", -1},
                                                     {"subseed_strength", 0},
                                                     {"seed_resize_from_h", -1},
                                                     {"seed_resize_from_w", -1},
                                                     {"scheduler", "Automatic"},
                                                     {"n_iter", 1},
                                                     {"restore_faces", false},
                                                     {"tiling", false},
                                                     {"do_not_save_samples", false},
                                                     {"do_not_save_grid", false},
                                                     {"eta", 0},
                                                     {"denoising_strength", 0},
                                                     {"s_min_uncond", 0},
                                                     {"s_churn", 0},
                                                     {"s_tmax", 0},
                                                     {"s_tmin", 0},
                                                     {"s_noise", 1},
                                                     {"override_settings_restore_afterwards", true},
                                                     {"refiner_checkpoint", ""},
                                                     {"refiner_switch_at", 0},
                                                     {"disable_extra_networks", false},
                                                     {"firstpass_image", ""},
                                                     {"comments", json::object()},
                                                     {"enable_hr", false},
                                                     {"firstphase_width", 0},
                                                     {"firstphase_height", 0},
                                                     {"hr_scale", 2},
                                                     {"hr_upscaler", ""},
                                                     {"hr_second_pass_steps", 0},
                                                     {"hr_resize_x", 0},
                                                     {"hr_resize_y", 0},
                                                     {"hr_checkpoint_name", ""},
                                                     {"hr_sampler_name", ""},
                                                     {"hr_scheduler", ""},
                                                     {"hr_prompt", ""},
                                                     {"hr_negative_prompt", ""},
                                                     {"force_task_id", ""},
                                                     {"sampler_index", "Euler"},
                                                     {"script_name", ""},
                                                     {"script_args", json::array()},
                                                     {"send_images", true},
                                                     {"save_images", false},
                                                     {"alwayson_scripts", json::object()},
                                                     {"infotext", ""}};
  return fields;
}

// img2img's fields beyond txt2img's that Kiln does not do, each taken at its neutral value or A1111's
// default. mask_blur: A1111 blurs the mask by 4 pixels unless told otherwise; Kiln binarises it as diffusers
// does (docs/serve.md says so), and front-ends send the default with every request.
const std::map<std::string, json>& unsupported_img2img_defaults() {
  static const std::map<std::string, json> fields = {
      {"resize_mode", 0},       {"mask_blur", 4},
      {"mask_blur_x", 4},       {"mask_blur_y", 4},
      {"inpainting_fill", 1},   {"initial_noise_multiplier", 1},
      {"image_cfg_scale", 1.5}, {"include_init_images", false},
      {"latent_mask", ""},      {"mask_round", true}};
  return fields;
}

// The mask with its values inverted (inpainting_mask_invert: the black region is repainted).
std::string inverted_mask(const json& v) {
  if (!v.is_string()) refuse("mask", "expected a PNG image in base64");
  Image mask = request_image_base64("mask", v.get_ref<const std::string&>());
  const int colour = mask.channels == 2 || mask.channels == 4 ? mask.channels - 1 : mask.channels;
  for (size_t i = 0; i < mask.pixels.size(); ++i)
    if (static_cast<int>(i % static_cast<size_t>(mask.channels)) < colour)
      mask.pixels[i] = static_cast<uint8_t>(255 - mask.pixels[i]);
  return base64_encode(mask.encode_png());
}

// txt2img's and img2img's bodies, as Kiln's request.
std::string a1111_body(std::string_view body, bool img2img) {
  const json j = parse_request_body(body);
  if (!j.is_object()) refuse("", "expected a JSON object");
  json out = json::object();
  std::optional<int64_t> width, height;
  bool full_res = img2img, invert = false;  // A1111's img2img inpaints "only masked" unless told otherwise
  int64_t full_res_padding = 0;
  for (const auto& [key, v] : j.items()) {
    if (img2img && key == "init_images") {
      if (!v.is_array() || v.empty()) refuse(key, "expected a list of base64 PNG images");
      out["image"] = v;
    } else if (img2img && key == "mask") {
      if (!neutral(v)) out["mask_image"] = v;
    } else if (img2img && key == "denoising_strength") {
      out["strength"] = v;
    } else if (img2img && key == "inpaint_full_res") {
      if (!v.is_boolean() && !v.is_number_integer()) refuse(key, "expected true or false");
      full_res = v.is_boolean() ? v.get<bool>() : v.get<int64_t>() != 0;
    } else if (img2img && key == "inpaint_full_res_padding") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) refuse(key, "expected a whole number of pixels");
      full_res_padding = v.get<int64_t>();
    } else if (img2img && key == "inpainting_mask_invert") {
      if (!v.is_boolean() && !v.is_number_integer()) refuse(key, "expected 0 or 1");
      invert = v.is_boolean() ? v.get<bool>() : v.get<int64_t>() != 0;
    } else if (const auto it = unsupported_img2img_defaults().find(key);
               img2img && it != unsupported_img2img_defaults().end()) {
      if (!neutral(v) && v != it->second)
        refuse(key, "Kiln does not do this (" + key + " is taken at its default or off only)");
    } else if (key == "prompt" || key == "negative_prompt") {
      if (!v.is_string()) refuse(key, "expected a string");
      if (key == "prompt" || !v.get<std::string>().empty()) out[key] = v;
    } else if (key == "steps") {
      out["steps"] = v;
    } else if (key == "cfg_scale") {
      out["guidance"] = v;
    } else if (key == "width" || key == "height") {
      if (!v.is_number_integer()) refuse(key, "expected a whole number of pixels");
      (key == "width" ? width : height) = v.get<int64_t>();
    } else if (key == "seed") {
      if (!v.is_number_integer()) refuse(key, "expected a whole number (-1: random)");
      if (v.get<int64_t>() != -1) out["seed"] = v;
    } else if (key == "batch_size") {
      out["n"] = v;
    } else if (key == "sampler_name") {
      if (!v.is_string()) refuse(key, "expected a string");
      const std::string s = v.get<std::string>();
      if (!s.empty() && s != "Euler")
        refuse(key, "'" + printable(s) +
                        "' does not map: Kiln's pipelines sample with their flow-match Euler scheduler "
                        "(\"Euler\")");
    } else if (key == "override_settings") {
      if (!v.is_object()) refuse(key, "expected an object");
      for (const auto& [setting, value] : v.items()) {
        if (setting == "sd_model_checkpoint" && value.is_string()) {
          out["model"] = value;
        } else if (!neutral(value)) {
          refuse(key, "setting '" + printable(setting) +
                          "' does not map (Kiln reads sd_model_checkpoint, the model's name)");
        }
      }
    } else if (const auto it = unsupported_defaults().find(key); it != unsupported_defaults().end()) {
      if (!neutral(v) && v != it->second)
        refuse(key, "Kiln does not do this (" + key + " is taken at its default or off only)");
    } else {
      refuse(key, std::string("not a field of A1111's ") + (img2img ? "img2img" : "txt2img"));
    }
  }
  if (!j.contains("prompt")) refuse("prompt", "required");
  if (img2img && !out.contains("image")) refuse("init_images", "required: the image to start from");
  if (out.contains("mask_image")) {
    if (invert) out["mask_image"] = inverted_mask(out["mask_image"]);
    // "Only masked": the region around the mask, inpaint_full_res_padding wider, repainted at the call's size
    // and pasted back, as diffusers' padding_mask_crop does.
    if (full_res) out["padding_mask_crop"] = full_res_padding;
  }
  // A1111 defaults to 512 x 512 for whatever is left out; Kiln to the model's own size.
  if (width || height)
    out["size"] = std::to_string(width.value_or(512)) + "x" + std::to_string(height.value_or(512));
  out["response_format"] = "b64_json";
  return out.dump();
}

}  // namespace

std::string a1111_txt2img_body(std::string_view body) {
  return a1111_body(body, false);
}

std::string a1111_img2img_body(std::string_view body) {
  return a1111_body(body, true);
}

}  // namespace kiln::serve
