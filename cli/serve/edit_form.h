// OpenAI's POST /v1/images/edits as its clients send it: a multipart form whose parts are `image` (one PNG
// file, or several: the openai client names a list's parts `image[]`), `mask` (a PNG file), `prompt`, `n`,
// `size`, `response_format`, `model`, and any of Kiln's JSON fields as text ("steps" = "4", "seed" = "7",
// "loras" = the JSON list). The text fields go through the same reader as a JSON body (generation_params.h),
// so every rule and message is the same.
//
// The mask: OpenAI's convention when it has transparency (its fully transparent pixels are edited, as
// OpenAI's API reads a mask), Kiln's otherwise (white is repainted, black kept, gray binarised at half).
//
// Parsing is a pure function of the parts (the fuzz target calls it). Bad input throws a RequestError whose
// field() names the form field at fault, which the server answers with 400.
#pragma once

#include <string>
#include <vector>

#include "cli/serve/generation_params.h"

namespace kiln::serve {

// One part of a multipart form, as the HTTP layer splits the body.
struct FormPart {
  std::string name;
  std::string filename;  // empty for a text field
  std::string content_type;
  std::string content;
};

// The parameters of an edit: at least one image and a prompt.
GenerationParams parse_edit_form(const std::vector<FormPart>& parts);

// A mask as Kiln reads it (white repaints): one with transparency becomes 255 - alpha in gray (OpenAI's
// transparent-is-edited); an opaque one is returned as it is.
Image mask_from_upload(const Image& mask);

}  // namespace kiln::serve
