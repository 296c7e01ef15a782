// Where the admin API's token comes from: a file (--admin-token-file), the
// environment (FAILSAFE_ADMIN_TOKEN), or, visible to `ps`, the command line.
#pragma once

#include <string>

#include "common/status.h"

namespace failsafe {

// The token, or "" when none is given (admin calls then come from loopback
// only). Two sources at once are an error; so are an unreadable or empty file.
Result<std::string> ResolveAdminToken(const std::string& flag_value, const std::string& file);

}  // namespace failsafe
