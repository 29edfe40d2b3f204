// PJRT_Error* and PJRT_Event* to kiln::Error. A plugin reports failures as PJRT_Error objects that the caller
// must destroy; these helpers read the message, destroy the error and throw a kiln::Error naming the call, so
// no error leaks and every message says which plugin call failed.
#pragma once

#include "xla/pjrt/c/pjrt_c_api.h"

namespace kiln::pjrt {

// Throws "<call>: <code>: <plugin message>" when `error` is non-null (destroying it first); returns
// otherwise.
void check(const PJRT_Api* api, PJRT_Error* error, const char* call);
// Destroys `error` without throwing (destructors, cleanup after another failure).
void discard(const PJRT_Api* api, PJRT_Error* error);
// Waits for `event`, destroys it and throws the event's error (named after `call`) if it completed with one.
void await_event(const PJRT_Api* api, PJRT_Event* event, const char* call);

}  // namespace kiln::pjrt
