#include "cli/serve/edit_form.h"

#include <nlohmann/json.hpp>
#include <set>

#include "kiln/pipelines/request_fields.h"

namespace kiln::serve {

namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& field, const std::string& message) {
  throw RequestError(field, field_for_message(field) + ": " + message);
}

// Whether a form's text for the field named `name` is the field's value as it is (a string) rather than JSON
// text (a number, a boolean, a list).
bool read_as_text(const std::string& name) {
  static const std::set<std::string> openai = {"model", "size", "response_format", "output_format", "quality",
                                               "style", "user", "background",      "moderation"};
  if (openai.count(name) > 0) return true;
  if (name == "loras") return false;  // a JSON list of {"name", "scale"}
  for (const RequestField& f : request_fields())
    if (f.json == name) return f.kind == FieldKind::Text || f.kind == FieldKind::Choice;
  return true;  // an unknown field: refused by name as a JSON body's would be
}

// A text part's value as the JSON body would carry it: JSON text for the typed fields ("4", "0.5", "true",
// "[...]"), else the text itself, which the typed reader then refuses with its own message.
json form_value(const std::string& name, const std::string& text) {
  if (read_as_text(name)) return text;
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded() || value.is_object()) return text;
  return value;
}

}  // namespace

Image mask_from_upload(const Image& mask) {
  const bool alpha = mask.channels == 2 || mask.channels == 4;
  if (!alpha) return mask;
  const size_t pixels = static_cast<size_t>(mask.width) * static_cast<size_t>(mask.height);
  const size_t a = static_cast<size_t>(mask.channels - 1);
  bool transparent = false;
  for (size_t i = 0; i < pixels && !transparent; ++i) transparent = mask.pixels[i * mask.channels + a] < 255;
  Image out;
  out.width = mask.width;
  out.height = mask.height;
  out.channels = transparent ? 1 : mask.channels - 1;
  out.pixels.resize(pixels * static_cast<size_t>(out.channels));
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* p = &mask.pixels[i * mask.channels];
    if (transparent)
      out.pixels[i] = static_cast<uint8_t>(255 - p[a]);
    else
      for (int c = 0; c < out.channels; ++c) out.pixels[i * out.channels + c] = p[c];
  }
  return out;
}

GenerationParams parse_edit_form(const std::vector<FormPart>& parts) {
  json body = json::object();
  std::vector<Image> images;
  std::optional<Image> mask;
  for (const FormPart& part : parts) {
    if (part.name == "image" || part.name == "image[]") {
      if (images.size() == kMaxRequestImages)
        refuse("image", "more than " + std::to_string(kMaxRequestImages) + " images");
      images.push_back(request_image("image", part.content));
    } else if (part.name == "mask" || part.name == "mask_image") {
      if (mask) refuse("mask", "given twice");
      mask = mask_from_upload(request_image("mask", part.content));
    } else {
      if (body.contains(part.name)) refuse(part.name, "given twice");
      body[part.name] = form_value(part.name, part.content);
    }
  }
  if (images.empty()) refuse("image", "required: the image to edit (a PNG file)");
  if (mask && (mask->width != images.front().width || mask->height != images.front().height))
    refuse("mask", std::to_string(mask->width) + "x" + std::to_string(mask->height) + ", the image is " +
                       std::to_string(images.front().width) + "x" + std::to_string(images.front().height) +
                       " (the mask covers the first image, at its size)");
  GenerationParams params = generation_params_from(body);
  params.request.image = std::move(images);
  params.request.mask_image = std::move(mask);
  return params;
}

}  // namespace kiln::serve
