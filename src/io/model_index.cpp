#include "kiln/io/model_index.h"

#include "kiln/core/error.h"
#include "kiln/io/component_config.h"

namespace kiln::io {

const PipelineComponent* ModelIndex::find(const std::string& name) const {
  for (const auto& c : components)
    if (c.name == name) return &c;
  return nullptr;
}

ModelIndex load_model_index(const std::string& path) {
  ModelIndex index;
  index.path = config_file_in(path, "model_index.json");
  index.raw = JsonConfig::load(index.path);
  const JsonConfig& raw = index.raw;
  index.class_name = raw.get<std::string>("_class_name");
  KILN_CHECK(!index.class_name.empty(), raw.where("_class_name")
                                            << " is empty (expected the pipeline class)");
  index.diffusers_version = raw.get_or<std::string>("_diffusers_version", "");
  for (const auto& key : raw.keys()) {
    if (key.starts_with("_")) continue;  // _class_name, _diffusers_version, _name_or_path: not components
    const std::string type = raw.type_of(key);
    // Scalars are pipeline options (booleans such as requires_safety_checker), not components.
    if (type != "array" && type != "null") continue;
    PipelineComponent c;
    c.name = key;
    // diffusers writes [null, null] (or null) for a component the pipeline was saved without.
    if (type == "array" && raw.dump(key) != "[null,null]") {
      std::vector<std::string> pair;
      try {
        pair = raw.get<std::vector<std::string>>(key);
      } catch (const Error&) {
        pair.clear();
      }
      KILN_CHECK(pair.size() == 2 && !pair[0].empty() && !pair[1].empty(),
                 raw.where(key) << ": expected [library, class] (two strings, or [null, null] for an absent "
                                   "component), got "
                                << raw.dump(key));
      c.library = pair[0];
      c.class_name = pair[1];
    }
    index.components.push_back(std::move(c));
  }
  return index;
}

}  // namespace kiln::io
