// Typed, read-only access to a JSON object loaded from a config file (config.json, scheduler_config.json,
// model_index.json, ...). Every error names the file, the key (with its path for nested objects) and what
// was expected, so a wrong or truncated config is fixed without a debugger.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace kiln::io {

// The C++ types a config value can be read as.
template <class T>
concept JsonValue =
    std::same_as<T, bool> || std::same_as<T, int> || std::same_as<T, int64_t> || std::same_as<T, float> ||
    std::same_as<T, double> || std::same_as<T, std::string> || std::same_as<T, std::vector<int>> ||
    std::same_as<T, std::vector<int64_t>> || std::same_as<T, std::vector<float>> ||
    std::same_as<T, std::vector<double>> || std::same_as<T, std::vector<std::string>>;

class JsonConfig {
 public:
  JsonConfig();  // an empty object
  // Reads and parses `path`; throws kiln::Error naming the file when it is missing, not JSON or not an
  // object.
  static JsonConfig load(const std::string& path);
  // Parses `text`; `origin` names it in error messages.
  static JsonConfig parse(const std::string& text, const std::string& origin);

  // The file this came from (and, for nested objects, the key path inside it).
  const std::string& origin() const { return origin_; }
  std::string where(const std::string& key) const;  // "path/config.json: key 'a.b'"

  bool contains(const std::string& key) const;        // present, possibly null
  bool has(const std::string& key) const;             // present and not null
  std::vector<std::string> keys() const;              // in file order
  std::string type_of(const std::string& key) const;  // "number", "string", "null", ... ; "missing" if absent

  // The value of `key` as T. Integers must be JSON integers in T's range; floats accept any number;
  // vectors need arrays whose elements all convert. Throws naming the file, key and expected type.
  template <JsonValue T>
  T get(const std::string& key) const;
  // `fallback` when the key is absent or null; still throws when present with the wrong type.
  template <JsonValue T>
  T get_or(const std::string& key, T fallback) const {
    return has(key) ? get<T>(key) : fallback;
  }
  template <JsonValue T>
  std::optional<T> get_optional(const std::string& key) const {
    return has(key) ? std::optional<T>(get<T>(key)) : std::nullopt;
  }
  // A nested object; throws when `key` is missing or not an object.
  JsonConfig object(const std::string& key) const;

  // The value of `key` (or the whole object when `key` is empty) as JSON text.
  std::string dump(const std::string& key = "", int indent = -1) const;

  struct Node;  // the parsed JSON (nlohmann::json, kept out of the public headers)

 private:
  JsonConfig(std::shared_ptr<const Node> root, std::vector<std::string> path, std::string origin);
  const Node& root() const { return *root_; }

  std::shared_ptr<const Node> root_;  // the whole document, shared by nested views
  std::vector<std::string> path_;     // keys from the root to this object
  std::string origin_;
  std::string prefix_;  // "a.b." for the object at a.b
};

}  // namespace kiln::io
