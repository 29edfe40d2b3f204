// Small helpers for the io tests: whole-file byte I/O and asserting on kiln::Error messages.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>

#include "kiln/core/error.h"

namespace kiln::testing {

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, text);
}

// The message of the kiln::Error that `f` throws, or a test failure when it throws none.
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a kiln::Error, none was thrown";
  return "";
}

// Passes when `message` contains every one of `parts`.
inline ::testing::AssertionResult has_all(const std::string& message,
                                          std::initializer_list<std::string> parts) {
  for (const auto& p : parts)
    if (message.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << message << "\" lacks \"" << p << "\"";
  return ::testing::AssertionSuccess();
}

}  // namespace kiln::testing

// EXPECT_KILN_ERROR(statement, "substring", ...): the statement throws kiln::Error mentioning every
// substring.
#define EXPECT_KILN_ERROR(stmt, ...) \
  EXPECT_TRUE(::kiln::testing::has_all(::kiln::testing::error_message([&] { stmt; }), {__VA_ARGS__}))
