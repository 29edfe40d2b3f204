#include "backends/pjrt/plugin/pjrt_errors.h"

#include <string>

#include "backends/pjrt/plugin/plugin.h"
#include "kiln/core/error.h"

namespace kiln::pjrt {
namespace {

// absl's status code names, which PJRT_Error_Code mirrors.
const char* code_name(PJRT_Error_Code code) {
  static constexpr const char* kNames[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < int(sizeof(kNames) / sizeof(kNames[0])) ? kNames[i] : "UNKNOWN";
}

}  // namespace

void discard(const PJRT_Api* api, PJRT_Error* error) {
  if (!error) return;
  KILN_PJRT_ARGS(PJRT_Error_Destroy_Args, args);
  args.error = error;
  api->PJRT_Error_Destroy(&args);
}

void check(const PJRT_Api* api, PJRT_Error* error, const char* call) {
  if (!error) return;
  KILN_PJRT_ARGS(PJRT_Error_Message_Args, message);
  message.error = error;
  api->PJRT_Error_Message(&message);
  std::string text(message.message ? message.message : "", message.message ? message.message_size : 0);
  KILN_PJRT_ARGS(PJRT_Error_GetCode_Args, code);
  code.error = error;
  PJRT_Error* code_error = api->PJRT_Error_GetCode(&code);
  const char* name = code_error ? "UNKNOWN" : code_name(code.code);
  discard(api, code_error);
  discard(api, error);  // the message was copied above: it lives in the error
  KILN_FAIL(call << ": " << name << ": " << (text.empty() ? "(the plugin gave no message)" : text));
}

void await_event(const PJRT_Api* api, PJRT_Event* event, const char* call) {
  if (!event) return;
  KILN_PJRT_ARGS(PJRT_Event_Await_Args, wait);
  wait.event = event;
  PJRT_Error* error = api->PJRT_Event_Await(&wait);
  KILN_PJRT_ARGS(PJRT_Event_Destroy_Args, destroy);
  destroy.event = event;
  discard(api, api->PJRT_Event_Destroy(&destroy));
  check(api, error, call);
}

}  // namespace kiln::pjrt
