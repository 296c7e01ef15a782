// JSON Lines in and out for the commands that answer a batch of requests.
#pragma once

#include <functional>
#include <string>

#include "common/status.h"

namespace failsafe {

// Calls `answer` for each non-empty line of `path` ("-": standard input) and
// prints what it returns as one line. The first error stops the batch and
// names the line.
Status AnswerJsonLines(const std::string& path,
                       const std::function<Result<std::string>(const std::string& line)>& answer);

}  // namespace failsafe
