#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace failsafe {

std::string ErrorBody(const ApiError& e) {
  nlohmann::json j = {
      {"message", e.message},
      {"type", e.type},
      {"param", e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param)},
      {"code", e.code}};
  return nlohmann::json{{"error", j}}.dump(-1, ' ', false,
                                           nlohmann::json::error_handler_t::replace);
}

ApiError BadRequest(std::string message, std::string param, std::string code) {
  return {400, "invalid_request_error", std::move(code), std::move(param), std::move(message)};
}

ApiError TooManyRequests(std::string message) {
  return {429, "rate_limit_error", "rate_limit_exceeded", "", std::move(message)};
}

ApiError ServiceUnavailable(std::string reason) {
  return {503, "service_unavailable_error", "engine_unavailable", "",
          "the engine cannot serve now: " + reason};
}

ApiError InternalError(std::string message) {
  return {500, "server_error", "internal_error", "", std::move(message)};
}

ApiError ErrorFromStatus(const Status& status, bool refused_at_admission) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return BadRequest(status.message());
    case StatusCode::kOutOfRange:
      return BadRequest(status.message(), "", "context_length_exceeded");
    case StatusCode::kResourceExhausted:
      if (refused_at_admission) return BadRequest(status.message(), "", "request_too_large");
      return TooManyRequests(status.message());
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kAborted:
      return ServiceUnavailable(status.message());
    default:
      return InternalError(status.message().empty() ? std::string(StatusCodeName(status.code()))
                                                    : status.message());
  }
}

}  // namespace failsafe
