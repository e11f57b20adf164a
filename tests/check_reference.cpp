// check_reference: checks that docs/reference.md names every public built-in of the headers and
// every public data member of the structs it lists, with its default.
//
//   check_reference <repository root> [--list | <page>]   (page: docs/reference.md by default)
//
// It reads include/lockstep/**/*.hpp (not detail/ folders, not `namespace detail` blocks) and
// finds the built-ins:
//   layer      a struct with `using layer_concept = layer_tag;`, or an alias `using N = activation<...>;`
//   loss       a struct with `using loss_concept = loss_tag;`
//   optimizer  a struct with `using optimizer_concept = optimizer_tag;`
//   schedule   a struct with `operator()(float base, std::uint64_t step)`
//   callback   a function returning `callback`
//   stage      a function returning a `..._closure`
//   source     a function returning `dataset<sample>`
// and the structs whose data members the page must list: every built-in struct above, every
// struct named `*_options`, `*_stats` or `evaluation`, and the structs of data/batch.hpp and
// data/sample.hpp. A data member is a line of the struct's body, indented two spaces, that
// declares one variable (`float lr = 1e-3f;  ///< ...`).
//
// docs/reference.md gives each built-in an entry: a table row that starts with `| \`name` or a
// heading that holds `\`name` (the entry then runs to the next heading). The entry of a struct
// names each data member in backticks, with its default as the header writes it when it has one:
// `lr = 1e-3f`, `timeout{60'000}`, or just `labels` for a member without one. With --list, the
// tool prints what it found instead. Exit code 1 when the page lacks something, each lack printed
// as `docs/reference.md: ...` with the header and line that declare it.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct member {
  std::string name, initializer;  // initializer: "= 1e-3f", "{60'000}", or ""
  std::size_t line = 0;
};

struct builtin {
  std::string kind, name, header;
  std::size_t line = 0;
  std::vector<member> members;
  bool has_members = false;  // a struct whose members the page must list
};

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

/// The data members of the struct whose body spans lines [first, last) (public part only).
std::vector<member> members_of(const std::vector<std::string>& lines, std::size_t first, std::size_t last,
                               bool is_class) {
  static const std::regex decl(
      R"(^  (?!static |using |template|friend |return |typedef |explicit |constexpr |virtual |inline |\[\[|//|/\*|~|\}|#)([A-Za-z_][A-Za-z0-9_:<>, ()&*]*[A-Za-z0-9_>])[ *&]+([a-z_][A-Za-z0-9_]*) *(= *[^;]+|\{[^;]*\})?;)");
  std::vector<member> out;
  bool visible = !is_class;
  for (std::size_t i = first; i < last; ++i) {
    const std::string t = trim(lines[i]);
    if (t == "public:") visible = true;
    if (t == "private:" || t == "protected:") visible = false;
    if (!visible) continue;
    std::smatch m;
    if (!std::regex_search(lines[i], m, decl)) continue;
    const std::string type = m[1].str();
    if (type.find('(') != std::string::npos && type.rfind("std::function<", 0) != 0) continue;  // not a variable
    std::string init = trim(m[3].str());
    if (!init.empty() && init[0] == '=') init = "= " + trim(init.substr(1));
    out.push_back({m[2].str(), init, i + 1});
  }
  return out;
}

/// The end (index of the `};` line at column 0) of the struct that opens at line `first`.
std::size_t body_end(const std::vector<std::string>& lines, std::size_t first) {
  for (std::size_t i = first; i < lines.size(); ++i)
    if (lines[i].rfind("};", 0) == 0) return i;
  return lines.size();
}

std::vector<builtin> scan(const fs::path& root) {
  std::vector<builtin> found;
  std::vector<fs::path> headers;
  for (const auto& e : fs::recursive_directory_iterator(root / "include" / "lockstep")) {
    const fs::path& p = e.path();
    const std::string rel = fs::relative(p, root).generic_string();
    if (p.extension() != ".hpp" || rel.find("/detail/") != std::string::npos ||
        rel.find("/testing/") != std::string::npos || rel.find("/backend/") != std::string::npos)
      continue;
    headers.push_back(p);
  }
  std::sort(headers.begin(), headers.end());
  static const std::regex struct_open(R"(^(?:template <.*> *)?(struct|class) ([a-z_][a-z0-9_]*)(?: [:{].*|\s*\{?)$)");
  static const std::regex alias_activation(R"(^using ([a-z_][a-z0-9_]*) = activation<)");
  static const std::regex returns_callback(R"(^(?:inline )?callback ([a-z_][a-z0-9_]*)\()");
  static const std::regex returns_closure(R"(^(?:inline )?([a-z_][a-z0-9_]*_closure)(?:<.*>)? ([a-z_][a-z0-9_]*)\()");
  static const std::regex returns_source(R"(^(?:inline )?dataset<sample> ([a-z_][a-z0-9_]*)\()");
  for (const auto& path : headers) {
    const auto lines = read_lines(path);
    const std::string rel = fs::relative(path, root).generic_string();
    const bool batch_header = rel == "include/lockstep/data/batch.hpp" || rel == "include/lockstep/data/sample.hpp";
    int detail_depth = 0;
    std::set<std::string> seen;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (l.rfind("namespace detail {", 0) == 0 || (l.rfind("namespace ", 0) == 0 && l.find("::detail {") != std::string::npos)) {
        ++detail_depth;
        continue;
      }
      if (detail_depth > 0 && l.rfind("}  // namespace", 0) == 0 && l.find("detail") != std::string::npos) {
        --detail_depth;
        continue;
      }
      if (detail_depth > 0) continue;
      const auto add = [&](const std::string& kind, const std::string& name) {
        if (seen.insert(kind + " " + name).second) found.push_back({kind, name, rel, i + 1, {}, false});
      };
      std::smatch m;
      if (std::regex_search(l, m, alias_activation)) add("layer", m[1]);
      if (std::regex_search(l, m, returns_callback)) add("callback", m[1]);
      if (std::regex_search(l, m, returns_closure)) add("stage", m[2]);
      if (std::regex_search(l, m, returns_source)) add("source", m[1]);
      // A struct: its kind from its body.
      std::string line = l;
      if (line.rfind("template <", 0) == 0 && i + 1 < lines.size() &&
          (lines[i + 1].rfind("struct ", 0) == 0 || lines[i + 1].rfind("class ", 0) == 0))
        continue;  // the struct line follows
      if (!std::regex_match(line, m, struct_open)) continue;
      if (line.back() == ';') continue;  // a declaration
      const bool is_class = m[1] == "class";
      const std::string name = m[2];
      const std::size_t end = body_end(lines, i);
      std::string kind;
      for (std::size_t k = i; k < end && kind.empty(); ++k) {
        const std::string& b = lines[k];
        if (b.find("using layer_concept = layer_tag;") != std::string::npos) kind = "layer";
        else if (b.find("using loss_concept = loss_tag;") != std::string::npos) kind = "loss";
        else if (b.find("using optimizer_concept = optimizer_tag;") != std::string::npos) kind = "optimizer";
        else if (b.find("operator()(float base, std::uint64_t") != std::string::npos) kind = "schedule";
      }
      const bool data_struct = name.size() > 8 && (name.substr(name.size() - 8) == "_options" ||
                                                   name.substr(name.size() - 6) == "_stats") ;
      if (kind.empty() && (data_struct || name == "evaluation" || name == "callback" || name == "history" ||
                           name == "training_control" || batch_header))
        kind = "struct";
      if (kind.empty()) continue;
      if (kind == "layer" && name == "activation") continue;  // its aliases are the layers
      builtin b{kind, name, rel, i + 1, members_of(lines, i + 1, end, is_class), true};
      if (seen.insert(kind + " " + name).second) found.push_back(std::move(b));
    }
  }
  return found;
}

/// The entry of `name` in the page: a table row `| \`name...` or the section under a heading
/// holding `\`name`; empty when there is none.
std::string entry_of(const std::vector<std::string>& page, const std::string& name) {
  const auto names_it = [&](const std::string& l, std::size_t at) {
    const std::string key = "`" + name;
    for (std::size_t p = l.find(key, at); p != std::string::npos; p = l.find(key, p + 1)) {
      const std::size_t after = p + key.size();
      if (after >= l.size()) return true;
      const char c = l[after];
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return true;
    }
    return false;
  };
  for (std::size_t i = 0; i < page.size(); ++i) {
    const std::string& l = page[i];
    if (l.rfind("| `", 0) == 0) {
      const std::size_t cell_end = l.find(" |", 2);
      if (names_it(l.substr(0, cell_end == std::string::npos ? l.size() : cell_end), 0)) return l;
    } else if (l.rfind("#", 0) == 0 && names_it(l, 0)) {
      const std::size_t level = l.find_first_not_of('#');
      std::string text = l + "\n";
      for (std::size_t j = i + 1; j < page.size(); ++j) {
        if (page[j].rfind("#", 0) == 0 && page[j].find_first_not_of('#') <= level) break;
        text += page[j] + "\n";
      }
      return text;
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: check_reference <repository root> [--list | <page>]\n");
    return 2;
  }
  const fs::path root = argv[1];
  const auto found = scan(root);
  if (argc > 2 && std::string(argv[2]) == "--list") {
    for (const auto& b : found) {
      std::printf("%-9s %-28s %s:%zu\n", b.kind.c_str(), b.name.c_str(), b.header.c_str(), b.line);
      for (const auto& m : b.members) std::printf("            .%s %s\n", m.name.c_str(), m.initializer.c_str());
    }
    return 0;
  }
  const std::string page_name = argc > 2 ? argv[2] : "docs/reference.md";
  const auto page = read_lines(root / page_name);
  const char* pn = page_name.c_str();
  if (page.empty()) {
    std::fprintf(stderr, "%s: missing or empty\n", pn);
    return 1;
  }
  std::size_t problems = 0, members = 0;
  for (const auto& b : found) {
    const std::string e = entry_of(page, b.name);
    if (e.empty()) {
      std::fprintf(stderr,
                   "%s: no entry for the %s `%s` (%s:%zu): add a table row starting with "
                   "`| \\`%s` (or a heading holding `\\`%s`) under its kind, with what it does%s\n",
                   pn, b.kind.c_str(), b.name.c_str(), b.header.c_str(), b.line, b.name.c_str(), b.name.c_str(),
                   b.members.empty() ? "" : " and its public data members with their defaults");
      ++problems;
      continue;
    }
    for (const auto& m : b.members) {
      ++members;
      std::string want = m.name;
      if (!m.initializer.empty()) want += m.initializer.front() == '=' ? " " + m.initializer : m.initializer;
      if (e.find("`" + want + "`") == std::string::npos && e.find("`." + want + "`") == std::string::npos) {
        std::fprintf(stderr,
                     "%s: the entry of `%s` lacks its member `%s` (%s:%zu): write it in backticks "
                     "as the header declares it, `%s`\n",
                     pn, b.name.c_str(), m.name.c_str(), b.header.c_str(), m.line, want.c_str());
        ++problems;
      }
    }
  }
  if (problems) {
    std::fprintf(stderr, "%s: %zu thing%s missing (of %zu built-ins and %zu members found in the headers)\n", pn,
                 problems, problems == 1 ? "" : "s", found.size(), members);
    return 1;
  }
  std::printf("%s names all %zu built-ins and %zu public data members of the headers\n", pn, found.size(), members);
  return 0;
}
