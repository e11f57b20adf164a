#pragma once
/// @file csv.hpp
/// The numeric CSV source: one sample per line, every field a number, optionally a header line,
/// a label column and target columns. Parsed once into a float table; errors name file, line and column.

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/memory.hpp>

namespace lockstep::data {

/// How to read a CSV file. Columns are counted from 0 here (messages name columns from 1, as
/// editors do, and say which option a column belongs to).
struct csv_options {
  bool header = false;                       ///< the first line holds column names (skipped)
  std::optional<std::size_t> label_column = std::nullopt;  ///< column holding an integer class label >= 0 (counted from 0)
  std::vector<std::size_t> target_columns{};  ///< columns holding regression targets, in this order (counted from 0)
  char delimiter = ',';                      ///< field separator
};

namespace detail {
/// `s` without the spaces and tabs around it and the CRs at its end.
inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

/// A field quoted for a message: at most 32 bytes of it, with quote, backslash and every byte
/// outside printable ASCII escaped (\xNN), and its length when it was cut.
inline std::string quote_field(std::string_view field) {
  constexpr std::size_t shown = 32;
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "'";
  for (const char ch : field.substr(0, shown)) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += ch;
    } else if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  out += '\'';
  if (field.size() > shown) out += " (cut; the field has " + std::to_string(field.size()) + " bytes)";
  return out;
}

/// For a numeral that from_chars finds out of range even as a double: whether it is too large
/// (rather than too close to zero), judged by the decimal exponent of its first nonzero digit.
inline bool numeral_too_large(std::string_view f) noexcept {
  std::size_t i = 0;
  if (i < f.size() && (f[i] == '+' || f[i] == '-')) ++i;
  long long int_digits = 0, frac_zeros = 0;
  bool nonzero = false, fraction = false;
  for (; i < f.size() && f[i] != 'e' && f[i] != 'E'; ++i) {
    if (f[i] == '.') {
      fraction = true;
    } else if (!fraction) {
      if (nonzero || f[i] != '0') {
        nonzero = true;
        if (int_digits < (1ll << 40)) ++int_digits;
      }
    } else if (!nonzero) {
      if (f[i] == '0') {
        if (frac_zeros < (1ll << 40)) ++frac_zeros;
      } else {
        nonzero = true;
      }
    }
  }
  long long e = 0;
  if (i < f.size()) {
    ++i;
    bool negative = false;
    if (i < f.size() && (f[i] == '+' || f[i] == '-')) negative = f[i++] == '-';
    for (; i < f.size() && f[i] >= '0' && f[i] <= '9'; ++i)
      if (e < (1ll << 40)) e = e * 10 + (f[i] - '0');
    if (negative) e = -e;
  }
  return (int_digits > 0 ? int_digits + e : e - frac_zeros) > 0;
}

/// Parses a whole field as a float: a finite value in float range, rounded to the nearest float
/// (values too close to zero round to zero or a subnormal). Returns nullopt with `why` set.
inline std::optional<float> parse_float(std::string_view field, std::string& why) {
  const char* first = field.data();
  const char* last = field.data() + field.size();
  if (first != last && *first == '+' && (last - first < 2 || first[1] != '-')) ++first;  // from_chars rejects '+'
  float v = 0;
  auto [p, ec] = std::from_chars(first, last, v);
  if (ec == std::errc{} && p == last) {
    if (std::isfinite(v)) return v;
    why = "is not a finite number";
    return std::nullopt;
  }
  if (ec == std::errc::result_out_of_range && p == last) {
    double d = 0;
    const auto [q, dec] = std::from_chars(first, last, d);
    const bool large = dec == std::errc{} ? std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())
                                          : numeral_too_large(field);
    if (large) {
      why = "is out of range (beyond +-3.4e38, the float range)";
      return std::nullopt;
    }
    if (dec == std::errc{}) return static_cast<float>(d);
    return field.front() == '-' ? -0.0f : 0.0f;
  }
  why = "is not a number";
  return std::nullopt;
}
}  // namespace detail

namespace detail {
/// The whole file at `path`. @throws data_error naming the file and the operating system's reason
/// (or that the file does not fit in memory).
inline std::string read_text_file(const std::string& path, const char* who) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw data_error(std::string(who) + ": " + path + ": cannot open file: " + os_reason(errno));
  std::string text;
  char buf[1 << 16];
  try {
    while (true) {
      const std::size_t got = std::fread(buf, 1, sizeof buf, f.get());
      text.append(buf, got);
      if (got < sizeof buf) break;
    }
  } catch (const std::bad_alloc&) {  // a file larger than memory
    throw data_error(std::string(who) + ": " + path + ": cannot allocate memory for the file's " +
                     std::to_string(text.size()) + "+ bytes");
  }
  if (std::ferror(f.get())) throw data_error(std::string(who) + ": " + path + ": read error: " + os_reason(errno));
  return text;
}
}  // namespace detail

/// Reads a numeric CSV file into a dataset of float samples: labels from `label_column`,
/// regression targets from `target_columns` (in that order), features from every other column.
/// Blank lines (only spaces and tabs, without the delimiter unless it is a space) are skipped; every
/// other line must have the same number of fields as the first data line. Spaces and tabs around a
/// field are ignored and so are those at the end of a line (a line ends in LF or CRLF), so with a
/// tab or space delimiter a line starting with the delimiter has an empty first field (an error),
/// and one ending with it has no empty last field; two delimiters in a row make an empty field (an
/// error: aligned space-separated columns are not read).
/// A number is anything std::from_chars reads as a finite value in float range (a leading '+' is
/// allowed), rounded to the nearest float; values too close to zero become zero or a subnormal.
/// @throws data_error "file:line:column: what" (the column counted from 1) for a missing, empty,
/// non-numeric, infinite, NaN or out-of-range field, a non-integer or negative label, or a row of
/// another length; "file: ..." when it cannot be read (with the operating system's reason); a
/// label or target column that the rows do not have, or a column given twice. A field quoted in a
/// message is escaped and cut to 32 bytes.
inline dataset<sample> csv(const std::string& path, const csv_options& options = {}) {
  constexpr const char* who = "lockstep::data::csv";
  const std::string text = detail::read_text_file(path, who);

  auto t = std::make_shared<table>();
  std::size_t columns = 0, line_no = 0, pos = 0;
  bool header_pending = options.header;
  auto fail = [&](std::size_t column, const std::string& what) {
    throw data_error(std::string(who) + ": " + path + ":" + std::to_string(line_no) +
                     (column ? ":" + std::to_string(column) : std::string()) + ": " + what);
  };
  // (column, slot) of every target column, sorted by column: one entry per listed column, so
  // nothing is sized by a column number (which may be far beyond the file's columns).
  std::vector<std::pair<std::size_t, std::size_t>> slots;
  slots.reserve(options.target_columns.size());
  for (std::size_t k = 0; k < options.target_columns.size(); ++k) {
    const std::size_t c = options.target_columns[k];
    if (options.label_column && *options.label_column == c)
      throw data_error(std::string(who) + ": " + path + ": column " + std::to_string(c) +
                       " (counted from 0) is both label_column and a target column");
    slots.emplace_back(c, k);
  }
  std::sort(slots.begin(), slots.end());
  for (std::size_t i = 1; i < slots.size(); ++i)
    if (slots[i].first == slots[i - 1].first)
      throw data_error(std::string(who) + ": " + path + ": target_columns names column " +
                       std::to_string(slots[i].first) + " (counted from 0) twice");
  // The target slot of column c (counted from 0), or -1.
  const auto slot_of = [&](std::size_t c) -> std::ptrdiff_t {
    const auto it = std::lower_bound(slots.begin(), slots.end(), std::pair<std::size_t, std::size_t>(c, 0));
    return it != slots.end() && it->first == c ? static_cast<std::ptrdiff_t>(it->second) : -1;
  };
  const std::size_t target_width = options.target_columns.size();
  const auto role_note = [&](std::size_t column) {  // which option a field belongs to, for messages
    const std::size_t c = column - 1;
    if (options.label_column && *options.label_column == c)
      return " (label_column " + std::to_string(c) + ", counted from 0)";
    if (slot_of(c) >= 0) return " (target column " + std::to_string(c) + ", counted from 0)";
    return std::string();
  };
  std::size_t first_line = 0;  // the line of the first data row, which sets the number of fields
  std::vector<float> row, targets(target_width);
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line = std::string_view(text).substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    // The line ending and the spaces and tabs at the end of the line come off the line (space-
    // separated output often ends its lines with one); those at its start stay, so a tab or space
    // delimiter keeps an empty first field (the columns would shift). Spaces and tabs around each
    // field are trimmed after the split.
    // Blank: only spaces and tabs, and no delimiter (a line of tabs under a tab delimiter is a row
    // of empty fields, refused below, not nothing); a space delimiter's lines of spaces are blank.
    const bool blank =
        detail::trim(line).empty() && (options.delimiter == ' ' || line.find(options.delimiter) == std::string_view::npos);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
    if (blank) continue;
    if (header_pending) {
      header_pending = false;
      continue;
    }
    row.clear();
    std::optional<std::int32_t> label;
    std::size_t start = 0, column = 0;
    while (true) {
      ++column;  // 1-based column number in messages
      std::size_t end = line.find(options.delimiter, start);
      const bool last = end == std::string_view::npos;
      if (last) end = line.size();
      const std::string_view field = detail::trim(line.substr(start, end - start));
      if (field.empty()) fail(column, "missing value (empty field)" + role_note(column));
      const bool is_label = options.label_column && column - 1 == *options.label_column;
      if (is_label) {
        std::int32_t v = 0;
        const auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
        if (ec == std::errc::result_out_of_range && p == field.data() + field.size())
          fail(column, "label " + detail::quote_field(field) + " is out of range (more than 2147483647)" +
                           role_note(column));
        if (ec != std::errc{} || p != field.data() + field.size() || v < 0)
          fail(column, "label " + detail::quote_field(field) + " is not an integer >= 0" + role_note(column));
        label = v;
      } else {
        std::string why;
        const std::optional<float> v = detail::parse_float(field, why);
        if (!v) fail(column, detail::quote_field(field) + " " + why + role_note(column));
        if (const std::ptrdiff_t k = slot_of(column - 1); k >= 0) targets[static_cast<std::size_t>(k)] = *v;
        else row.push_back(*v);
      }
      if (last) break;
      start = end + 1;
    }
    if (columns == 0) {
      columns = column;
      first_line = line_no;
      const auto missing = [&](const std::string& what) {
        fail(0, what + " does not exist: columns are counted from 0, and the row has " + std::to_string(columns) +
                    " field" + (columns == 1 ? "" : "s") + " (columns 0 to " + std::to_string(columns - 1) + ")");
      };
      if (options.label_column && *options.label_column >= columns)
        missing("label_column " + std::to_string(*options.label_column));
      for (const std::size_t c : options.target_columns)
        if (c >= columns) missing("target_columns names column " + std::to_string(c) + ", which");
      t->width = row.size();
      t->target_width = target_width;
    } else if (column != columns) {
      fail(column < columns ? column + 1 : columns + 1,
           (column < columns ? "missing field: expected " : "extra field: expected ") + std::to_string(columns) +
               " fields (as the first data row, line " + std::to_string(first_line) + "), found " +
               std::to_string(column));
    }
    t->values.insert(t->values.end(), row.begin(), row.end());
    t->targets.insert(t->targets.end(), targets.begin(), targets.end());
    if (label) t->labels.push_back(*label);
    ++t->rows;
  }
  return from_table(std::move(t));
}

}  // namespace lockstep::data
