#include "cli/json_lines.h"

#include <cstdio>
#include <fstream>
#include <iostream>

namespace failsafe {

Status AnswerJsonLines(const std::string& path,
                       const std::function<Result<std::string>(const std::string& line)>& answer) {
  std::ifstream file;
  if (path != "-") {
    file.open(path);
    if (!file) return NotFound("{}: cannot open", path);
  }
  std::istream& in = path == "-" ? std::cin : file;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    auto out = answer(line);
    if (!out.ok()) return InvalidArgument("line {}: {}", n, out.status().message());
    std::printf("%s\n", out->c_str());
  }
  return Status::Ok();
}

}  // namespace failsafe
