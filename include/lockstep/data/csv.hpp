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
}  // namespace detail

/// Reads a numeric CSV file into a dataset of float samples (labels from `label_column`). Blank
/// lines are skipped; every other line must have the same number of fields as the first data line.
/// @throws data_error "file:line:column: what" for a missing, empty or non-numeric field, a
/// non-integer or negative label, or a row of another length; "file: ..." when it cannot be read.
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
        if (ec != std::errc{} || p != field.data() + field.size() || v < 0)
          fail(column, "label '" + std::string(field) + "' is not an integer >= 0");
        label = v;
      } else {
        float v = 0;
        const char* first = field.data();
        if (*first == '+') ++first;  // from_chars rejects a leading '+'
        const auto [p, ec] = std::from_chars(first, field.data() + field.size(), v);
        if (ec != std::errc{} || p != field.data() + field.size())
          fail(column, "'" + std::string(field) + "' is not a number");
        if (!std::isfinite(v)) fail(column, "'" + std::string(field) + "' is not a finite number");
        row.push_back(v);
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
