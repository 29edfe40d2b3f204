// kiln generate's flags for the request's fields, made from the one declaration of the request
// (kiln/pipelines/request_fields.h): one option per field that has a flag, its help the field's, the values
// kept as typed and then converted by the field's kind and checked against its range, each error naming the
// flag ("--steps 0 is below the minimum 1"). No field is spelled out here.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/pipelines/pipeline_request.h"

namespace CLI {
class App;  // <CLI/CLI.hpp>
}  // namespace CLI

namespace kiln::cli {

// The values typed for each field's flag, by field name (several for a list's repeated flag).
struct RequestFlags {
  std::map<std::string, std::vector<std::string>> values;

  bool given(const std::string& field) const {
    const auto it = values.find(field);
    return it != values.end() && !it->second.empty();
  }
};

// Adds a flag for every request field that has one.
void add_request_flags(CLI::App& command, RequestFlags& flags);

// The request the flags describe. Image fields hold placeholders (an empty Image per path), so that a class
// that does not take them refuses them before any file is read; image_paths gives their paths. Throws
// kiln::Error naming the flag of a value of the wrong kind or out of range.
PipelineRequest request_from_flags(const RequestFlags& flags);
// The paths given to an image field's flag.
std::vector<std::string> image_paths(const RequestFlags& flags, const std::string& field);

// The flag of a request field ("num_inference_steps" -> "--steps"), or the field's name when it has none.
std::string flag_of(const std::string& field);

}  // namespace kiln::cli
