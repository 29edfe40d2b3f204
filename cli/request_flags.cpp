#include "cli/request_flags.h"

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "kiln/core/error.h"
#include "kiln/core/limits.h"
#include "kiln/pipelines/request_fields.h"

namespace kiln::cli {

namespace {

bool is_list(FieldKind kind) {
  return kind == FieldKind::TextList || kind == FieldKind::IntegerList || kind == FieldKind::ImageList ||
         kind == FieldKind::GeneratorList;
}

std::string bound_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

int64_t parse_integer(const RequestField& f, const std::string& typed) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(typed.c_str(), &end, 10);
  KILN_CHECK(!typed.empty() && end == typed.c_str() + typed.size() && errno != ERANGE,
             f.flag << ": expected an integer, got '" << typed << "'");
  const int64_t min = f.min ? static_cast<int64_t>(*f.min) : std::numeric_limits<int64_t>::min();
  const int64_t max = f.max ? static_cast<int64_t>(*f.max) : std::numeric_limits<int64_t>::max();
  limits::check_range(f.flag, v, min, max);
  return v;
}

double parse_number(const RequestField& f, const std::string& typed) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(typed.c_str(), &end);
  KILN_CHECK(!typed.empty() && end == typed.c_str() + typed.size(),
             f.flag << ": expected a number, got '" << typed << "'");
  if (f.within(v)) return v;
  // Bounds a user would type say so; a bound at float's largest only keeps the value finite.
  const double largest = std::numeric_limits<float>::max();
  if (f.min && f.max && *f.max != largest && *f.min != -largest)
    KILN_FAIL(f.flag << " " << typed << " is outside " << (f.open ? "(" : "[") << bound_text(*f.min) << ", "
                     << bound_text(*f.max) << (f.open ? ")" : "]"));
  KILN_FAIL(f.flag << ": expected " << f.range() << ", got " << typed);
}

uint64_t parse_seed(const RequestField& f, const std::string& typed) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(typed.c_str(), &end, 10);
  KILN_CHECK(!typed.empty() && typed[0] != '-' && end == typed.c_str() + typed.size() && errno != ERANGE,
             f.flag << ": expected an integer from 0 to 2^64-1, got '" << typed << "'");
  return v;
}

bool parse_boolean(const RequestField& f, const std::string& typed) {
  if (typed.empty() || typed == "true" || typed == "1") return true;
  if (typed == "false" || typed == "0") return false;
  KILN_FAIL(f.flag << ": expected true or false, got '" << typed << "'");
}

// The field's value as the flag typed it, checked against its range with the flag's name.
FieldValue parse(const RequestField& f, const std::vector<std::string>& typed) {
  switch (f.kind) {
    case FieldKind::Text:
      limits::check_prompt_size(f.flag, typed.back());
      return typed.back();
    case FieldKind::TextList:
      for (const std::string& s : typed) limits::check_prompt_size(f.flag, s);
      return typed;
    case FieldKind::Integer:
      return parse_integer(f, typed.back());
    case FieldKind::IntegerList: {
      std::vector<int64_t> values;
      for (const std::string& s : typed) values.push_back(parse_integer(f, s));
      return values;
    }
    case FieldKind::Number:
      return parse_number(f, typed.back());
    case FieldKind::Boolean:
      return parse_boolean(f, typed.back());
    case FieldKind::Choice:
      return typed.back();
    case FieldKind::Image:
      return Image();  // read once the pipeline is known to take it
    case FieldKind::ImageList:
      return std::vector<Image>(typed.size());
    case FieldKind::Generator:
      return Generator(parse_seed(f, typed.back()));
    case FieldKind::GeneratorList: {
      std::vector<Generator> generators;
      for (const std::string& s : typed) generators.emplace_back(parse_seed(f, s));
      return generators;
    }
    case FieldKind::Tensor:
      break;
  }
  KILN_FAIL(f.flag << ": a " << field_kind_name(f.kind) << " cannot be given on the command line");
}

}  // namespace

void add_request_flags(CLI::App& command, RequestFlags& flags) {
  for (const RequestField& f : request_fields()) {
    if (f.flag.empty()) continue;
    std::vector<std::string>& values = flags.values[f.name];
    CLI::Option* option =
        command.add_option(f.flag, values, f.help + " (" + f.accepted() + "; " + f.name + ")")->expected(1);
    if (is_list(f.kind)) {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
      if (f.kind == FieldKind::IntegerList) option->delimiter(',');
    } else {
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    }
    if (f.kind == FieldKind::Choice) option->check(CLI::IsMember(f.choices));
    // A boolean flag alone means true (--karras); --karras false turns it off explicitly.
    if (f.kind == FieldKind::Boolean) option->expected(0, 1)->default_str("true");
  }
}

PipelineRequest request_from_flags(const RequestFlags& flags) {
  PipelineRequest request;
  for (const RequestField& f : request_fields()) {
    const auto it = flags.values.find(f.name);
    if (f.flag.empty() || it == flags.values.end() || it->second.empty()) continue;
    const FieldValue value = parse(f, it->second);
    try {
      f.set(request, value);
    } catch (const RequestError& e) {
      KILN_FAIL(f.flag << ": " << e.what());
    }
  }
  return request;
}

std::vector<std::string> image_paths(const RequestFlags& flags, const std::string& field) {
  const auto it = flags.values.find(field);
  return it == flags.values.end() ? std::vector<std::string>{} : it->second;
}

std::string flag_of(const std::string& field) {
  const RequestField* f = find_request_field(field);
  return f != nullptr && !f->flag.empty() ? f->flag : field;
}

}  // namespace kiln::cli
