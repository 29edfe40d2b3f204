#include "kiln/io/json_config.h"

#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/json_depth.h"
#include "kiln/core/error.h"

namespace kiln::io {

struct JsonConfig::Node {
  // ordered_json keeps keys in file order, so keys() and dumps read like the file.
  nlohmann::ordered_json value;
};

namespace {

using Json = nlohmann::ordered_json;

template <class T>
const char* expected_name() {
  if constexpr (std::is_same_v<T, bool>)
    return "a boolean";
  else if constexpr (std::is_same_v<T, int>)
    return "an integer (32-bit)";
  else if constexpr (std::is_same_v<T, int64_t>)
    return "an integer";
  else if constexpr (std::is_floating_point_v<T>)
    return "a number";
  else if constexpr (std::is_same_v<T, std::string>)
    return "a string";
  else if constexpr (std::is_same_v<T, std::vector<std::string>>)
    return "an array of strings";
  else if constexpr (std::is_same_v<T, std::vector<int>> || std::is_same_v<T, std::vector<int64_t>>)
    return "an array of integers";
  else
    return "an array of numbers";
}

// Converts one JSON scalar; returns nullopt when its type or range does not fit T.
template <class T>
std::optional<T> convert_scalar(const Json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(u);
    } else if (v.is_number_integer()) {
      const auto i = v.get<int64_t>();
      if (i >= std::numeric_limits<T>::min() && i <= std::numeric_limits<T>::max()) return static_cast<T>(i);
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    if (v.is_number()) return v.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (v.is_string()) return v.get<std::string>();
  }
  return std::nullopt;
}

template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};

std::string short_dump(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// The object a view shows. Nested views walk from the root: configs are small, and no pointer into the
// tree is kept.
const Json& value_of(const JsonConfig::Node& root, const std::vector<std::string>& path) {
  const Json* v = &root.value;
  for (const auto& k : path) v = &(*v)[k];
  return *v;
}

}  // namespace

JsonConfig::JsonConfig() : JsonConfig(std::make_shared<Node>(Node{Json::object()}), {}, "<empty>") {}

JsonConfig::JsonConfig(std::shared_ptr<const Node> root, std::vector<std::string> path, std::string origin)
    : root_(std::move(root)), path_(std::move(path)), origin_(std::move(origin)) {
  for (const auto& k : path_) prefix_ += k + ".";
}

JsonConfig JsonConfig::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), path << ": cannot read config file (missing or unreadable)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse(text, path);
}

JsonConfig JsonConfig::parse(const std::string& text, const std::string& origin) {
  check_json_depth(text, origin);
  auto node = std::make_shared<Node>();
  try {
    node->value = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number beyond double
    KILN_FAIL(origin << ": not valid JSON: " << e.what());
  }
  KILN_CHECK(node->value.is_object(), origin << ": expected a JSON object, got " << node->value.type_name());
  return JsonConfig(std::move(node), {}, origin);
}

std::string JsonConfig::where(const std::string& key) const {
  return origin_ + ": key '" + prefix_ + key + "'";
}

bool JsonConfig::contains(const std::string& key) const {
  return value_of(root(), path_).contains(key);
}

bool JsonConfig::has(const std::string& key) const {
  auto it = value_of(root(), path_).find(key);
  return it != value_of(root(), path_).end() && !it->is_null();
}

std::vector<std::string> JsonConfig::keys() const {
  std::vector<std::string> out;
  for (auto it = value_of(root(), path_).begin(); it != value_of(root(), path_).end(); ++it)
    out.push_back(it.key());
  return out;
}

std::string JsonConfig::type_of(const std::string& key) const {
  auto it = value_of(root(), path_).find(key);
  return it == value_of(root(), path_).end() ? "missing" : it->type_name();
}

template <JsonValue T>
T JsonConfig::get(const std::string& key) const {
  KILN_CHECK(contains(key), where(key) << " is missing (expected " << expected_name<T>() << ")");
  const Json& v = value_of(root(), path_)[key];
  if constexpr (is_vector<T>::value) {
    using E = typename T::value_type;
    KILN_CHECK(v.is_array(), where(key) << ": expected " << expected_name<T>() << ", got " << v.type_name()
                                        << " " << short_dump(v));
    T out;
    for (size_t i = 0; i < v.size(); ++i) {
      auto e = convert_scalar<E>(v[i]);
      KILN_CHECK(e.has_value(), where(key) << ": expected " << expected_name<T>() << ", element " << i
                                           << " is " << v[i].type_name() << " " << short_dump(v[i]));
      out.push_back(*e);
    }
    return out;
  } else {
    auto out = convert_scalar<T>(v);
    KILN_CHECK(out.has_value(), where(key) << ": expected " << expected_name<T>() << ", got " << v.type_name()
                                           << " " << short_dump(v));
    return *out;
  }
}

template bool JsonConfig::get<bool>(const std::string&) const;
template int JsonConfig::get<int>(const std::string&) const;
template int64_t JsonConfig::get<int64_t>(const std::string&) const;
template float JsonConfig::get<float>(const std::string&) const;
template double JsonConfig::get<double>(const std::string&) const;
template std::string JsonConfig::get<std::string>(const std::string&) const;
template std::vector<int> JsonConfig::get<std::vector<int>>(const std::string&) const;
template std::vector<int64_t> JsonConfig::get<std::vector<int64_t>>(const std::string&) const;
template std::vector<float> JsonConfig::get<std::vector<float>>(const std::string&) const;
template std::vector<double> JsonConfig::get<std::vector<double>>(const std::string&) const;
template std::vector<std::string> JsonConfig::get<std::vector<std::string>>(const std::string&) const;

JsonConfig JsonConfig::object(const std::string& key) const {
  KILN_CHECK(contains(key), where(key) << " is missing (expected an object)");
  const Json& v = value_of(root(), path_)[key];
  KILN_CHECK(v.is_object(), where(key)
                                << ": expected an object, got " << v.type_name() << " " << short_dump(v));
  std::vector<std::string> path = path_;
  path.push_back(key);
  return JsonConfig(root_, std::move(path), origin_);
}

std::string JsonConfig::dump(const std::string& key, int indent) const {
  if (key.empty()) return value_of(root(), path_).dump(indent);
  KILN_CHECK(contains(key), where(key) << " is missing");
  return value_of(root(), path_)[key].dump(indent);
}

}  // namespace kiln::io
