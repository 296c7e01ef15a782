// Plans as JSON: for the `plan` command and for sending a plan to workers.
#pragma once

#include <string>

#include "common/status.h"
#include "placement/plan.h"

namespace failsafe {

std::string PlanToJson(const Plan& plan);
// Parses and validates.
Result<Plan> PlanFromJson(const std::string& text);

}  // namespace failsafe
