#include "cli/serve/api_key.h"

#include <arpa/inet.h>

#include <cctype>
#include <cstdint>

namespace kiln::serve {

namespace {

// Every byte of `expected` is read whatever `given` holds; differences are accumulated, not returned early.
bool constant_time_equal(std::string_view given, std::string_view expected) {
  volatile uint8_t diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const uint8_t g = i < given.size() ? uint8_t(given[i]) : 0;
    diff = diff | (g ^ uint8_t(expected[i]));
  }
  return diff == 0;
}

}  // namespace

bool bearer_matches(std::string_view authorization, std::string_view expected) {
  constexpr std::string_view kScheme = "bearer ";
  // The scheme is case-insensitive (RFC 7235) and no secret; the key is neither.
  if (authorization.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
  return constant_time_equal(authorization.substr(kScheme.size()), expected);
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

}  // namespace kiln::serve
