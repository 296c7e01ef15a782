#include "cli/admin_token.h"

#include <sys/stat.h>

#include <cstdlib>

#include "common/log.h"
#include "model/file_util.h"

namespace failsafe {

namespace {
constexpr char kTokenEnv[] = "FAILSAFE_ADMIN_TOKEN";

std::string Trim(std::string s) {
  const char* ws = " \t\r\n";
  s.erase(s.find_last_not_of(ws) + 1);
  s.erase(0, s.find_first_not_of(ws));
  return s;
}
}  // namespace

Result<std::string> ResolveAdminToken(const std::string& flag_value, const std::string& file) {
  const char* env = std::getenv(kTokenEnv);
  const bool from_env = env && *env;
  const int sources = !flag_value.empty() + !file.empty() + from_env;
  if (sources > 1) {
    return InvalidArgument(
        "the admin token is given more than once (--admin-token, --admin-token-file, {}): give "
        "one",
        kTokenEnv);
  }
  if (!flag_value.empty()) {
    FS_LOG_WARN(
        "--admin-token shows the token to anyone who can list processes; prefer "
        "--admin-token-file or {}",
        kTokenEnv);
    return Trim(flag_value);
  }
  if (from_env) {
    std::string token = Trim(env);
    if (token.empty()) return InvalidArgument("{} holds only white space", kTokenEnv);
    return token;
  }
  if (file.empty()) return std::string();
  FS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
  std::string token = Trim(text);
  if (token.empty()) return InvalidArgument("--admin-token-file {}: the file is empty", file);
  if (token.find_first_of("\r\n") != std::string::npos)
    return InvalidArgument("--admin-token-file {}: the token must be one line", file);
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
    FS_LOG_WARN("--admin-token-file {}: other users may read it (chmod 600 keeps it private)",
                file);
  }
  return token;
}

}  // namespace failsafe
