#pragma once
/// @file json.hpp
/// What the JSON that lockstep writes for other programs (safetensors headers, traces) needs of
/// JSON: strings, quoted and escaped.

#include <string>
#include <string_view>

namespace lockstep::io::detail {

/// Appends `s` as a JSON string: quoted, with '"' and '\\' escaped and control characters
/// written as \u00XX; other bytes pass through (the caller checks UTF-8 where it must).
inline void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace lockstep::io::detail
