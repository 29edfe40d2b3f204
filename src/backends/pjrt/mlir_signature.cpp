#include "backends/pjrt/mlir_signature.h"

#include <cctype>
#include <charconv>
#include <string>

#include "kiln/core/error.h"

namespace kiln::pjrt {
namespace {

constexpr const char* kWhat = "PJRT compile: the module's @main";

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The position just past the bracket closing the one at `open` ('(', '<', '{' or '['), skipping string
// literals (attribute values such as shardings hold brackets); npos when it is never closed.
size_t past_closing(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"') {
      for (++i; i < s.size() && s[i] != '"'; ++i)
        if (s[i] == '\\') ++i;
      continue;
    }
    if (c == '-' && i + 1 < s.size() && s[i + 1] == '>') {  // "->" is an arrow, not a closing '>'
      ++i;
      continue;
    }
    if (c == '(' || c == '<' || c == '{' || c == '[') ++depth;
    if (c == ')' || c == '>' || c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// Splits the inside of a bracketed list at its top-level commas.
std::vector<std::string_view> split_top_level(std::string_view s) {
  std::vector<std::string_view> parts;
  if (trim(s).empty()) return parts;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"' || c == '(' || c == '<' || c == '{' || c == '[') {
      const size_t end = c == '"' ? s.find('"', i + 1) : past_closing(s, i) - 1;
      KILN_CHECK(end != std::string_view::npos && end < s.size(), kWhat << " has an unbalanced signature");
      i = end;
    } else if (c == ',') {
      parts.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  parts.push_back(trim(s.substr(start)));
  return parts;
}

// The bracketed list starting at `open`, without its brackets.
std::string_view inside(std::string_view s, size_t open) {
  const size_t end = past_closing(s, open);
  KILN_CHECK(end != std::string_view::npos, kWhat << "'s parameter list is never closed");
  return s.substr(open + 1, end - open - 2);
}

// One pretty-form parameter "%arg0: tensor<4xf32> {attrs}" -> "tensor<4xf32>".
std::string_view pretty_parameter_type(std::string_view param) {
  const size_t colon = param.find(':');
  KILN_CHECK(colon != std::string_view::npos, kWhat << " has a parameter without a type: '" << param << "'");
  std::string_view type = trim(param.substr(colon + 1));
  const size_t open = type.find('<');
  if (open != std::string_view::npos) {
    const size_t end = past_closing(type, open);
    if (end != std::string_view::npos) type = type.substr(0, end);
  }
  return type;
}

bool element_type(std::string_view name, DType& out) {
  static constexpr std::pair<std::string_view, DType> kTypes[] = {
      {"f32", DType::Float32}, {"bf16", DType::BFloat16}, {"f16", DType::Float16}, {"f64", DType::Float64},
      {"i64", DType::Int64},   {"i32", DType::Int32},     {"i16", DType::Int16},   {"i8", DType::Int8},
      {"ui8", DType::UInt8},   {"i1", DType::Bool}};
  for (const auto& [n, d] : kTypes) {
    if (n == name) {
      out = d;
      return true;
    }
  }
  return false;
}

}  // namespace

ArraySpec parse_tensor_type(std::string_view type) {
  type = trim(type);
  KILN_CHECK(type.starts_with("tensor<") && type.ends_with(">"),
             kWhat << " has a parameter of type '" << type << "': expected a tensor<...> type");
  std::string_view body = type.substr(7, type.size() - 8);
  KILN_CHECK(
      body.find(',') == std::string_view::npos,
      kWhat << " has a parameter of type '" << type << "' with an encoding: expected a plain dense tensor");
  ArraySpec spec;
  // Dimensions are "<n>x" prefixes; what follows the last is the element type.
  while (!body.empty() && (std::isdigit(static_cast<unsigned char>(body.front())) || body.front() == '?')) {
    const size_t x = body.find('x');
    KILN_CHECK(x != std::string_view::npos, kWhat << " has a malformed tensor type '" << type << "'");
    const std::string_view dim = body.substr(0, x);
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(dim.data(), dim.data() + dim.size(), n);
    KILN_CHECK(ec == std::errc() && end == dim.data() + dim.size(),
               kWhat << " has a parameter of type '" << type
                     << "': expected static dimensions (Kiln's shapes are static)");
    spec.dims.push_back(n);
    body.remove_prefix(x + 1);
  }
  KILN_CHECK(element_type(body, spec.dtype),
             kWhat << " has a parameter of type '" << type << "': element type '" << body
                   << "' is not one of f32, bf16, f16, f64, i64, i32, i16, i8, ui8, i1");
  return spec;
}

std::vector<ArraySpec> main_parameters(std::string_view text) {
  std::vector<std::string_view> types;
  size_t at = text.find("@main");  // "@main" itself, not "@main_1"
  while (at != std::string_view::npos && at + 5 < text.size() &&
         (std::isalnum(static_cast<unsigned char>(text[at + 5])) || text[at + 5] == '_'))
    at = text.find("@main", at + 5);
  if (at != std::string_view::npos && text.find("func.func") < at) {
    // The pretty form: the parameter list follows the name.
    size_t open = at + 5;
    while (open < text.size() && std::isspace(static_cast<unsigned char>(text[open]))) ++open;
    KILN_CHECK(open < text.size() && text[open] == '(', kWhat << " has no parameter list after its name");
    for (std::string_view p : split_top_level(inside(text, open))) types.push_back(pretty_parameter_type(p));
  } else if (const size_t name = text.find("sym_name = \"main\""); name != std::string_view::npos) {
    // The generic form: function_type is an attribute of the same "func.func" op, before or after sym_name.
    const size_t op = text.rfind("\"func.func\"", name);
    KILN_CHECK(op != std::string_view::npos, kWhat << ": sym_name \"main\" is not on a \"func.func\" op");
    const size_t ft = text.find("function_type = (", op);
    KILN_CHECK(ft != std::string_view::npos, kWhat << " has no function_type attribute");
    for (std::string_view p : split_top_level(inside(text, ft + 16))) types.push_back(p);
  } else {
    KILN_FAIL("PJRT compile: the module has no func.func @main (the entry point PJRT runs)");
  }
  std::vector<ArraySpec> params;
  for (std::string_view t : types) params.push_back(parse_tensor_type(t));
  return params;
}

}  // namespace kiln::pjrt
