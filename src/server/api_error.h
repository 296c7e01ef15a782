// Errors the API answers with: an HTTP status and the OpenAI error body
// {"error": {"message", "type", "param", "code"}}, `code` a string.
//
// Status codes mean what they say: 400 bad input only, 404 an unknown route or
// model, 405 a wrong method, 413 a body over the limit, 415 a body that is not
// JSON, 431 headers over the limit, 429 overload (try again later), 503 the
// engine cannot serve now (with the reason), 500 a bug or an OS error.
#pragma once

#include <string>

#include "common/status.h"

namespace failsafe {

struct ApiError {
  int status = 400;   // HTTP status
  std::string type;   // "invalid_request_error", "rate_limit_error", ...
  std::string code;   // machine-readable: "model_not_found", "context_length_exceeded", ...
  std::string param;  // the request field at fault; empty: none
  std::string message;
};

// The JSON body for an error.
std::string ErrorBody(const ApiError& error);

// 400: bad input; `param` names the field, `code` defaults to "invalid_value".
ApiError BadRequest(std::string message, std::string param = "",
                    std::string code = "invalid_value");
// 429: overload; the client may retry later.
ApiError TooManyRequests(std::string message);
// 503: the engine cannot serve now; `reason` says why.
ApiError ServiceUnavailable(std::string reason);
// 500: a bug or an OS error.
ApiError InternalError(std::string message);

// The answer for an engine Status that refused or ended a request:
// invalid input -> 400, queue full -> 429, unavailable -> 503, else 500.
// `refused_at_admission` turns kResourceExhausted into 400: a request too big
// for the devices' memory does not fit by retrying.
ApiError ErrorFromStatus(const Status& status, bool refused_at_admission);

}  // namespace failsafe
