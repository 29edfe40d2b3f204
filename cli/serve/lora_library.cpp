#include "cli/serve/lora_library.h"

#include <algorithm>
#include <filesystem>

#include "kiln/core/error.h"

namespace kiln::serve {

namespace fs = std::filesystem;

namespace {

constexpr const char* kExtension = ".safetensors";

}  // namespace

LoraLibrary::LoraLibrary(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  std::error_code error;
  KILN_CHECK(fs::is_directory(dir_, error), "--lora-dir " << dir_
                                                          << ": not a folder (the LoRA files a request may "
                                                             "name, as <name>.safetensors)");
}

std::vector<std::string> LoraLibrary::names() const {
  std::vector<std::string> out;
  if (dir_.empty()) return out;
  std::error_code error;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, error))
    if (e.is_regular_file(error) && e.path().extension() == kExtension)
      out.push_back(e.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string LoraLibrary::path_of(const std::string& name) const {
  return (fs::path(dir_) / (name + kExtension)).string();
}

void LoraLibrary::check(const std::vector<LoraChoice>& loras) const {
  if (loras.empty()) return;
  if (dir_.empty())
    throw RequestError("loras",
                       "loras: this server offers no LoRA adapters (start kiln serve with --lora-dir DIR)");
  for (const LoraChoice& l : loras) {
    std::error_code error;
    if (!fs::is_regular_file(path_of(l.name), error)) {
      std::string offered;
      for (const std::string& n : names()) offered += (offered.empty() ? "" : ", ") + n;
      throw RequestError("loras", "loras: no adapter named '" + l.name +
                                      "' (offered: " + (offered.empty() ? "none" : offered) + ")");
    }
  }
}

void LoraLibrary::use(DiffusionPipeline& pipe, const std::vector<LoraChoice>& loras) const {
  check(loras);
  const std::vector<std::string> active = pipe.get_active_adapters();
  std::vector<std::string> loaded;
  for (const auto& [component, names] : pipe.get_list_adapters())
    for (const std::string& n : names)
      if (std::find(loaded.begin(), loaded.end(), n) == loaded.end()) loaded.push_back(n);
  std::vector<std::string> names;
  std::vector<double> scales;
  for (const LoraChoice& l : loras) {
    if (std::find(loaded.begin(), loaded.end(), l.name) == loaded.end()) {
      try {
        pipe.load_lora_weights(path_of(l.name), {.adapter_name = l.name});
      } catch (const RequestError&) {
        throw;
      } catch (const Error& e) {
        throw RequestError(
            "loras", "loras: adapter '" + l.name + "' does not fit " + pipe.class_name() + ": " + e.what());
      }
    }
    names.push_back(l.name);
    scales.push_back(l.scale);
  }
  if (names.empty() && active.empty()) return;  // nothing loaded is active: the plain path already
  pipe.set_adapters(names, scales);
}

}  // namespace kiln::serve
