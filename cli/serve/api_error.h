// An HTTP answer other than success, shaped as OpenAI's API shapes its errors, which its clients read:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "size", "code": null}}
#pragma once

#include <stdexcept>
#include <string>

namespace kiln::serve {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string param, const std::string& message, std::string code = "")
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}

  int status;           // 400, 401, 404, 413, 500, 503, ...
  std::string type;     // invalid_request_error, authentication_error, not_found_error, server_error, ...
  std::string param;    // the JSON field at fault, or ""
  std::string code;     // e.g. model_not_found, invalid_api_key, queue_full; or ""
  int retry_after = 0;  // seconds, sent as Retry-After when > 0
};

}  // namespace kiln::serve
