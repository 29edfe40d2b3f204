// Reads the case files written by tools/kernel_refs/reduction.py: each case has operands named
// "<case>.<operand>", torch's result "<case>.expected", and a metadata entry "op=... key=value ..."
// describing the call. Helpers here parse those descriptions and compare with a tolerance chosen by the
// result's dtype.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/io/safetensors.h"
#include "support/test_data.h"

namespace kiln::testing {

struct ReferenceCase {
  std::string name;
  std::map<std::string, std::string> args;

  bool has(const std::string& key) const { return args.count(key) != 0; }
  const std::string& arg(const std::string& key) const {
    auto it = args.find(key);
    if (it == args.end()) throw std::runtime_error("case " + name + " has no argument " + key);
    return it->second;
  }
  std::vector<int64_t> ints(const std::string& key) const {
    std::vector<int64_t> v;
    std::stringstream ss(arg(key));
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty()) v.push_back(std::stoll(item));
    return v;
  }
  int64_t integer(const std::string& key) const { return std::stoll(arg(key)); }
  double real(const std::string& key) const { return std::stod(arg(key)); }
};

inline std::vector<ReferenceCase> load_reference_cases(const io::SafetensorsFile& file) {
  std::vector<ReferenceCase> cases;
  std::stringstream list(file.metadata().at("cases"));
  for (std::string name; std::getline(list, name, ',');) {
    ReferenceCase c{name, {}};
    std::stringstream desc(file.metadata().at(name));
    for (std::string kv; desc >> kv;) {
      const auto eq = kv.find('=');
      c.args[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

// The stored operand, with the case's `transpose=a,b` applied when `transposable`.
inline Tensor operand(const io::SafetensorsFile& file, const ReferenceCase& c, const std::string& key,
                      bool transposable = true) {
  Tensor t = file.tensor(c.name + "." + key);
  if (transposable && c.has("transpose")) {
    const auto tr = c.ints("transpose");
    t = t.transpose(tr[0], tr[1]);
  }
  return t;
}

// Matches torch's result: same dtype and shape, values within one rounding of the result dtype (the float32
// math underneath may add in a different order than torch's).
// A case may widen the absolute tolerance with atol=... where the data makes any float32 result that inexact.
inline ::testing::AssertionResult matches_reference(const Tensor& actual, const Tensor& expected,
                                                    const ReferenceCase& c) {
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << dtype_name(actual.dtype()) << " != expected " << dtype_name(expected.dtype());
  auto atol = [&](double fallback) { return c.has("atol") ? c.real("atol") : fallback; };
  switch (expected.dtype()) {
    case DType::BFloat16:
      return all_close(actual, expected, 1e-2, atol(1e-2));
    case DType::Float16:
      return all_close(actual, expected, 2e-3, atol(1e-3));
    case DType::Float32:
      return all_close(actual, expected, 2e-5, atol(1e-5));
    default:
      return all_close(actual, expected, 0, 0);
  }
}

}  // namespace kiln::testing
