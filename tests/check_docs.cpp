// check_docs: checks that the code a documentation page shows is code that compiles.
//
//   check_docs <repository root> <page.md>
//
// Every ```cpp block of the page must carry a marker on the line just above its opening fence:
//
//   <!-- example: <file>#<region> -->   the block is, verbatim, the text between the lines
//                                       `// example-begin <region>` and `// example-end` of
//                                       <file> (a compiled source under tests/ or examples/;
//                                       `#` instead of `//` in a CMake file), less the
//                                       indentation all its lines share (a region may sit
//                                       inside a function)
//   <!-- example: <file> -->            the block is the whole of <file>
//   <!-- not compiled: <reason> -->     the block is not meant to compile, and says why
//
// A block in another language (```cmake, ```sh, ...) may carry an example marker too, and is then
// checked the same way. Region names are letters, digits, `_`, `-` and `.`. Each problem is
// printed as `<page>:<line>: <what to do>`; the exit code is 1 when there is one, else 0.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::vector<std::string> read_lines(const std::string& path, bool& ok) {
  std::ifstream in(path, std::ios::binary);
  ok = static_cast<bool>(in);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool valid_name(std::string_view n) {
  if (n.empty()) return false;
  for (const char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return false;
  return true;
}

/// A fence line: its backticks and the info string after them (the language).
struct fence {
  std::size_t ticks = 0;
  std::string info;
};
std::optional<fence> fence_of(const std::string& line) {
  const std::string_view t = trim(line);
  std::size_t n = 0;
  while (n < t.size() && t[n] == '`') ++n;
  if (n < 3) return std::nullopt;
  return fence{n, std::string(trim(t.substr(n)))};
}

/// A marker line: `<!-- example: ... -->` or `<!-- not compiled: ... -->`.
struct marker {
  enum kind_t { example, not_compiled } kind;
  std::string file, region, reason;
};
std::optional<marker> marker_of(std::string_view line, std::string& problem) {
  line = trim(line);
  if (!starts_with(line, "<!--") || line.size() < 7 || line.substr(line.size() - 3) != "-->") return std::nullopt;
  const std::string_view body = trim(line.substr(4, line.size() - 7));
  if (starts_with(body, "not compiled:")) {
    const std::string_view reason = trim(body.substr(13));
    if (reason.empty()) problem = "`<!-- not compiled: <reason> -->` needs a reason after the colon";
    return marker{marker::not_compiled, "", "", std::string(reason)};
  }
  if (starts_with(body, "example:")) {
    const std::string_view target = trim(body.substr(8));
    const std::size_t hash = target.find('#');
    marker m{marker::example, std::string(target.substr(0, hash)), "", ""};
    if (hash != std::string_view::npos) {
      m.region = std::string(target.substr(hash + 1));
      if (!valid_name(m.region))
        problem = "region name '" + m.region + "' may hold only letters, digits, '_', '-' and '.'";
    }
    if (m.file.empty()) problem = "`<!-- example: <file>#<region> -->` needs a file";
    return m;
  }
  return std::nullopt;  // another comment
}

/// `lines` less the leading spaces every non-blank line has.
std::vector<std::string> dedent(std::vector<std::string> lines) {
  std::size_t common = std::string::npos;
  for (const auto& l : lines) {
    if (trim(l).empty()) continue;
    common = std::min(common, l.find_first_not_of(' '));
  }
  if (common == std::string::npos || common == 0) return lines;
  for (auto& l : lines) l = l.size() >= common ? l.substr(common) : std::string();
  return lines;
}

/// The text of region `name` of `lines` (between its begin and end lines), or nullopt.
std::optional<std::vector<std::string>> region_of(const std::vector<std::string>& lines, const std::string& name,
                                                  std::string& problem) {
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::string_view t = trim(lines[i]);
    for (const std::string_view comment : {std::string_view("//"), std::string_view("#")}) {
      if (!starts_with(t, comment)) continue;
      const std::string_view rest = trim(t.substr(comment.size()));
      if (!starts_with(rest, "example-begin ") || trim(rest.substr(14)) != name) continue;
      std::vector<std::string> out;
      for (std::size_t j = i + 1; j < lines.size(); ++j) {
        const std::string_view u = trim(lines[j]);
        if (starts_with(u, comment) && starts_with(trim(u.substr(comment.size())), "example-end")) {
          const std::string_view end_name = trim(trim(u.substr(comment.size())).substr(11));
          if (!end_name.empty() && end_name != name) {
            problem = "region '" + name + "' ends at a line that names region '" + std::string(end_name) + "'";
            return std::nullopt;
          }
          return dedent(out);
        }
        out.push_back(lines[j]);
      }
      problem = "region '" + name + "' has no `example-end` line";
      return std::nullopt;
    }
  }
  problem = "has no line `// example-begin " + name + "`";
  return std::nullopt;
}

constexpr const char* how_to_mark =
    "  put one of these on the line just above the opening fence:\n"
    "    <!-- example: tests/<folder>/<file>.cpp#<region> -->\n"
    "        the block is the text between `// example-begin <region>` and `// example-end` in that\n"
    "        compiled source, verbatim: write the code there, in a test that builds (and runs), then\n"
    "        copy it into the page\n"
    "    <!-- not compiled: <why> -->\n"
    "        the block is not meant to compile: say why (a sketch, a list of signatures, code that\n"
    "        needs a GPU or MPI that the tests do not have)\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: check_docs <repository root> <page.md>\n");
    return 2;
  }
  const std::string root = argv[1], page = argv[2];
  const std::string page_path = page.front() == '/' ? page : root + "/" + page;
  bool ok = false;
  const auto lines = read_lines(page_path, ok);
  if (!ok) {
    std::fprintf(stderr, "%s: cannot read the page\n", page.c_str());
    return 2;
  }
  std::size_t problems = 0, compiled = 0, not_compiled = 0;
  const auto report = [&](std::size_t line, const std::string& what) {
    std::fprintf(stderr, "%s:%zu: %s\n", page.c_str(), line + 1, what.c_str());
    ++problems;
  };
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto open = fence_of(lines[i]);
    if (!open) {
      std::string problem;
      if (const auto m = marker_of(lines[i], problem)) {  // a marker must be followed by a block
        std::size_t j = i + 1;
        while (j < lines.size() && trim(lines[j]).empty()) ++j;
        if (j >= lines.size() || !fence_of(lines[j]))
          report(i, "this marker is not on the line just above a fenced code block: move it there, or remove it");
      }
      continue;
    }
    // The block: up to the closing fence of as many backticks or more.
    std::size_t close = i + 1;
    while (close < lines.size()) {
      const auto f = fence_of(lines[close]);
      if (f && f->info.empty() && f->ticks >= open->ticks) break;
      ++close;
    }
    // The block's text, less the indentation of its opening fence (a block inside a list item).
    std::vector<std::string> body(lines.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                  lines.begin() + static_cast<std::ptrdiff_t>(std::min(close, lines.size())));
    const std::size_t indent = lines[i].find_first_not_of(' ');
    for (auto& l : body) l = l.substr(std::min(indent, l.find_first_not_of(' ') == std::string::npos ? l.size()
                                                                                                   : l.find_first_not_of(' ')));
    const bool is_cpp = open->info == "cpp" || open->info == "c++" || starts_with(open->info, "cpp ");
    // The marker: the line just above the opening fence.
    std::string problem;
    std::optional<marker> m;
    if (i > 0) m = marker_of(lines[i - 1], problem);
    if (!problem.empty()) report(i - 1, problem);
    if (!m) {
      if (is_cpp) report(i, "this ```cpp block carries no marker;\n" + std::string(how_to_mark));
    } else if (m->kind == marker::not_compiled) {
      ++not_compiled;
    } else if (!problem.empty()) {
      // reported above
    } else if (!starts_with(m->file, "tests/") && !starts_with(m->file, "examples/")) {
      report(i - 1, "the marker names '" + m->file +
                        "', which is not a compiled source: name a file under tests/ or examples/");
    } else {
      bool file_ok = false;
      const auto source = read_lines(root + "/" + m->file, file_ok);
      const std::string where = m->file + (m->region.empty() ? "" : "#" + m->region);
      if (!file_ok) {
        report(i - 1, "the marker names '" + m->file + "', which does not exist");
      } else {
        std::string why;
        const auto expected = m->region.empty() ? std::optional<std::vector<std::string>>(source)
                                                : region_of(source, m->region, why);
        if (!expected) {
          report(i - 1, m->file + " " + why + ": mark the region in the source, or fix the marker");
        } else if (*expected != body) {
          std::size_t k = 0;
          while (k < expected->size() && k < body.size() && (*expected)[k] == body[k]) ++k;
          std::ostringstream msg;
          msg << "the block differs from " << where << " (which is what compiles): copy the region into the page "
              << "again.\n  first difference at line " << k + 1 << " of the block:\n    page:   "
              << (k < body.size() ? "`" + body[k] + "`" : std::string("(the block ends here)")) << "\n    source: "
              << (k < expected->size() ? "`" + (*expected)[k] + "`" : std::string("(the region ends here)"));
          report(i + 1 + k, msg.str());
        } else {
          ++compiled;
        }
      }
    }
    i = close;  // past the closing fence
  }
  if (problems) {
    std::fprintf(stderr, "%s: %zu problem%s with its code blocks\n", page.c_str(), problems, problems == 1 ? "" : "s");
    return 1;
  }
  std::printf("%s: %zu code block%s match compiled sources, %zu marked `not compiled`\n", page.c_str(), compiled,
              compiled == 1 ? "" : "s", not_compiled);
  return 0;
}
