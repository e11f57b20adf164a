#pragma once
/// @file csv.hpp
/// The numeric CSV source: one sample per line, every field a number, optionally a header line
/// and a label column. Parsed once into a float table; errors name file, line and column.

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
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

/// How to read a CSV file.
struct csv_options {
  bool header = false;                       ///< the first line holds column names (skipped)
  std::optional<std::size_t> label_column = std::nullopt;  ///< 0-based column holding an integer class label >= 0
  char delimiter = ',';                      ///< field separator
};

namespace detail {
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

/// Reads a numeric CSV file into a dataset of float samples (labels from `label_column`). Blank
/// lines are skipped; every other line must have the same number of fields as the first data line.
/// A number is anything std::from_chars reads as a finite value in float range (a leading '+' is
/// allowed), rounded to the nearest float; values too close to zero become zero or a subnormal.
/// @throws data_error "file:line:column: what" for a missing, empty, non-numeric, infinite, NaN or
/// out-of-range field, a non-integer or negative label, or a row of another length; "file: ..."
/// when it cannot be read. A field quoted in a message is escaped and cut to 32 bytes.
inline dataset<sample> csv(const std::string& path, const csv_options& options = {}) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw data_error("lockstep::data::csv: " + path + ": cannot open file");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw data_error("lockstep::data::csv: " + path + ": read error");

  auto t = std::make_shared<table>();
  std::size_t columns = 0, line_no = 0, pos = 0;
  bool header_pending = options.header;
  auto fail = [&](std::size_t column, const std::string& what) {
    throw data_error("lockstep::data::csv: " + path + ":" + std::to_string(line_no) +
                     (column ? ":" + std::to_string(column) : std::string()) + ": " + what);
  };
  std::vector<float> row;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    const std::string_view line = detail::trim(std::string_view(text).substr(pos, eol - pos));
    pos = eol + 1;
    ++line_no;
    if (line.empty()) continue;
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
      if (field.empty()) fail(column, "missing value (empty field)");
      const bool is_label = options.label_column && column - 1 == *options.label_column;
      if (is_label) {
        std::int32_t v = 0;
        const auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
        if (ec == std::errc::result_out_of_range && p == field.data() + field.size())
          fail(column, "label " + detail::quote_field(field) + " is out of range (more than 2147483647)");
        if (ec != std::errc{} || p != field.data() + field.size() || v < 0)
          fail(column, "label " + detail::quote_field(field) + " is not an integer >= 0");
        label = v;
      } else {
        std::string why;
        const std::optional<float> v = detail::parse_float(field, why);
        if (!v) fail(column, detail::quote_field(field) + " " + why);
        row.push_back(*v);
      }
      if (last) break;
      start = end + 1;
    }
    if (columns == 0) {
      columns = column;
      if (options.label_column && *options.label_column >= columns)
        fail(0, "label column " + std::to_string(*options.label_column) + " does not exist (the row has " +
                    std::to_string(columns) + " fields)");
      t->width = row.size();
    } else if (column != columns) {
      fail(column < columns ? column + 1 : columns + 1,
           column < columns ? "missing field: expected " + std::to_string(columns) + " fields, found " +
                                  std::to_string(column)
                            : "extra field: expected " + std::to_string(columns) + " fields, found " +
                                  std::to_string(column));
    }
    t->values.insert(t->values.end(), row.begin(), row.end());
    if (label) t->labels.push_back(*label);
    ++t->rows;
  }
  return from_table(std::move(t));
}

}  // namespace lockstep::data
