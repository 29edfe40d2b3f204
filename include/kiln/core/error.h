// kiln::Error: the one exception type Kiln throws. Messages name the op, file, tensor or flag at fault
// and what was expected, so a user can act on them without a debugger.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace kiln

// KILN_CHECK(cond, "op: expected ... got " << value): builds the message only when the check fails.
#define KILN_CHECK(cond, msg)                                                    \
  do {                                                                           \
    if (!(cond)) [[unlikely]] {                                                  \
      std::ostringstream kiln_check_stream_;                                     \
      kiln_check_stream_ << msg;                                                 \
      ::kiln::detail::throw_error(__FILE__, __LINE__, kiln_check_stream_.str()); \
    }                                                                            \
  } while (0)

// Unconditional failure. Not KILN_CHECK(false, ...): an unoptimised build must see the noreturn call
// directly, or -Wreturn-type fires after a KILN_FAIL at the end of a function.
#define KILN_FAIL(msg)                                                        \
  do {                                                                        \
    std::ostringstream kiln_fail_stream_;                                     \
    kiln_fail_stream_ << msg;                                                 \
    ::kiln::detail::throw_error(__FILE__, __LINE__, kiln_fail_stream_.str()); \
  } while (0)
