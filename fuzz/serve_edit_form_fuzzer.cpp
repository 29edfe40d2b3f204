// The form of OpenAI's POST /v1/images/edits (cli/serve/edit_form.h) after the HTTP layer split it into
// parts: any parts through serve::parse_edit_form, which must answer bad input with a RequestError naming a
// form field and accept only an edit it can run: at least one image, a mask (read by OpenAI's or Kiln's
// convention) of the first image's size, the text fields as a JSON body's, each within its declared range.
//
// The input: parts separated by a line "--"; each part its name on its first line, the rest its content
// (PNG bytes for "image" and "mask", text for the others).
#include <string>
#include <vector>

#include "cli/serve/edit_form.h"
#include "fuzz_support.h"
#include "kiln/pipelines/request_fields.h"

using namespace kiln;

namespace {

std::vector<serve::FormPart> parts_of(std::string_view input) {
  std::vector<serve::FormPart> parts;
  const std::string_view separator = "\n--\n";
  for (;;) {
    const size_t end = input.find(separator);
    const std::string_view part = input.substr(0, end);
    const size_t line = part.find('\n');
    serve::FormPart p;
    p.name = std::string(part.substr(0, line));
    if (line != std::string_view::npos) p.content = std::string(part.substr(line + 1));
    parts.push_back(std::move(p));
    if (end == std::string_view::npos || parts.size() > 64) break;
    input.remove_prefix(end + separator.size());
  }
  return parts;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::make_runtime_deterministic();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<serve::FormPart> parts = parts_of({reinterpret_cast<const char*>(data), size});
  fuzz::expect_clean([&] {
    const serve::GenerationParams params = serve::parse_edit_form(parts);
    const PipelineRequest& r = params.request;
    fuzz::require(!r.image.empty() && r.image.size() <= serve::kMaxRequestImages,
                  "an edit without its images");
    for (const Image& image : r.image)
      fuzz::require(
          image.width > 0 && image.height > 0 &&
              image.pixels.size() == size_t(image.width) * size_t(image.height) * size_t(image.channels),
          "an image whose pixels do not fill it");
    if (r.mask_image)
      fuzz::require(
          r.mask_image->width == r.image.front().width && r.mask_image->height == r.image.front().height,
          "a mask of another size than the image's");
    try {
      check_field_ranges(r);
    } catch (const RequestError&) {
      fuzz::require(false, "an accepted form with a field out of its range");
    }
  });
  return 0;
}
