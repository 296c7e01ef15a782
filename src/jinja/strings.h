// Python's str operations on UTF-8 text (code points, Unicode case mapping
// through utf8proc), and the string filters of Jinja2 built on them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace failsafe::jinja {

// The most copies `*`, `center`, `indent` and `tojson(indent=)` make of a
// string or a list in one operation: past it a template's arithmetic is an
// error, not an allocation of terabytes.
constexpr int64_t kMaxRepetition = 1 << 20;

std::string Lower(const std::string& s);
std::string Upper(const std::string& s);
std::string Capitalize(const std::string& s);   // str.capitalize()
std::string PythonTitle(const std::string& s);  // str.title()
std::string JinjaTitle(const std::string& s);   // the `title` filter
// str.strip(chars) (chars null: whitespace), on the chosen sides.
std::string Strip(const std::string& s, const std::string* chars, bool left, bool right);
// str.split(sep, maxsplit) (sep null: runs of whitespace); rsplit if `right`.
std::vector<std::string> Split(const std::string& s, const std::string* sep, int64_t maxsplit,
                               bool right);
std::vector<std::string> SplitLines(const std::string& s, bool keepends);
std::string Replace(const std::string& s, const std::string& old, const std::string& with,
                    int64_t count);
std::string HtmlEscape(const std::string& s);
std::string Indent(const std::string& s, const std::string& pad, bool first, bool blank);
std::string Center(const std::string& s, int64_t width);
int64_t WordCount(const std::string& s);
// Python float(s) for a stripped string ("1.5", "1e3", "inf", "nan").
std::optional<double> ParseFloat(const std::string& s);

// Code-point index of a byte offset.
int64_t CodePointIndex(const std::string& s, size_t byte_offset);

}  // namespace failsafe::jinja
