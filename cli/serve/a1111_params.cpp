#include "cli/serve/a1111_params.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

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

}  // namespace

std::string a1111_txt2img_body(std::string_view body) {
  const json j = parse_request_body(body);
  if (!j.is_object()) refuse("", "expected a JSON object");
  json out = json::object();
  std::optional<int64_t> width, height;
  for (const auto& [key, v] : j.items()) {
    if (key == "prompt" || key == "negative_prompt") {
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
      refuse(key, "not a field of A1111's txt2img");
    }
  }
  if (!j.contains("prompt")) refuse("prompt", "required");
  // A1111 defaults to 512 x 512 for whatever is left out; Kiln to the model's own size.
  if (width || height)
    out["size"] = std::to_string(width.value_or(512)) + "x" + std::to_string(height.value_or(512));
  out["response_format"] = "b64_json";
  return out.dump();
}

}  // namespace kiln::serve
