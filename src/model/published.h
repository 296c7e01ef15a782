// The shapes of published models the project plans and simulates for
// without their weights: their Hugging Face config.json values.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"

namespace failsafe {

// "llama-3.1-70b" (meta-llama/Llama-3.1-70B-Instruct) and "mixtral-8x22b"
// (mistralai/Mixtral-8x22B-Instruct-v0.1).
Result<ModelConfig> PublishedModelConfig(const std::string& name);
std::vector<std::string> PublishedModelNames();

}  // namespace failsafe
