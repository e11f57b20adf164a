#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <lockstep/core/trace.hpp>
#include <lockstep/io/trace.hpp>

namespace ls = lockstep;
namespace fs = std::filesystem;

namespace {

// A small strict JSON parser for checking the trace files (RFC 8259 values; numbers as double).
struct json;
using json_object = std::map<std::string, json>;
using json_array = std::vector<json>;
struct json {
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<json_array>, std::shared_ptr<json_object>> v;
  [[nodiscard]] bool is_object() const { return std::holds_alternative<std::shared_ptr<json_object>>(v); }
  [[nodiscard]] bool is_array() const { return std::holds_alternative<std::shared_ptr<json_array>>(v); }
  [[nodiscard]] bool is_number() const { return std::holds_alternative<double>(v); }
  [[nodiscard]] bool is_string() const { return std::holds_alternative<std::string>(v); }
  [[nodiscard]] const json_object& object() const { return *std::get<std::shared_ptr<json_object>>(v); }
  [[nodiscard]] const json_array& array() const { return *std::get<std::shared_ptr<json_array>>(v); }
  [[nodiscard]] double number() const { return std::get<double>(v); }
  [[nodiscard]] const std::string& string() const { return std::get<std::string>(v); }
};

class json_parser {
public:
  explicit json_parser(const std::string& s) : s_(s) {}
  json parse() {
    json j = value();
    ws();
    if (p_ != s_.size()) throw std::runtime_error("trailing characters at " + std::to_string(p_));
    return j;
  }

private:
  void ws() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\n' || s_[p_] == '\t' || s_[p_] == '\r')) ++p_;
  }
  char next() {
    if (p_ >= s_.size()) throw std::runtime_error("unexpected end");
    return s_[p_++];
  }
  void lit(const char* w) {
    for (const char* c = w; *c; ++c)
      if (next() != *c) throw std::runtime_error("bad literal at " + std::to_string(p_));
  }
  std::string str() {
    if (next() != '"') throw std::runtime_error("expected a string at " + std::to_string(p_));
    std::string out;
    for (;;) {
      const char c = next();
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) throw std::runtime_error("control character");
      if (c == '\\') {
        const char e = next();
        if (e == 'u') {
          for (int i = 0; i < 4; ++i)
            if (!std::isxdigit(static_cast<unsigned char>(next()))) throw std::runtime_error("bad \\u");
          out += '?';
        } else if (std::string("\"\\/bfnrt").find(e) == std::string::npos) {
          throw std::runtime_error("bad escape");
        } else {
          out += e;
        }
      } else {
        out += c;
      }
    }
  }
  json value() {
    ws();
    if (p_ >= s_.size()) throw std::runtime_error("unexpected end");
    const char c = s_[p_];
    if (c == '{') {
      ++p_;
      auto o = std::make_shared<json_object>();
      ws();
      if (s_[p_] == '}') {
        ++p_;
        return {o};
      }
      for (;;) {
        ws();
        std::string k = str();
        if (o->count(k)) throw std::runtime_error("duplicate key " + k);
        ws();
        if (next() != ':') throw std::runtime_error("expected :");
        (*o)[k] = value();
        ws();
        const char d = next();
        if (d == '}') return {o};
        if (d != ',') throw std::runtime_error("expected , or }");
      }
    }
    if (c == '[') {
      ++p_;
      auto a = std::make_shared<json_array>();
      ws();
      if (s_[p_] == ']') {
        ++p_;
        return {a};
      }
      for (;;) {
        a->push_back(value());
        ws();
        const char d = next();
        if (d == ']') return {a};
        if (d != ',') throw std::runtime_error("expected , or ]");
      }
    }
    if (c == '"') return {str()};
    if (c == 't') return lit("true"), json{true};
    if (c == 'f') return lit("false"), json{false};
    if (c == 'n') return lit("null"), json{nullptr};
    const std::size_t start = p_;
    if (s_[p_] == '-') ++p_;
    if (p_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[p_]))) throw std::runtime_error("bad number");
    if (s_[p_] == '0' && p_ + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_ + 1])))
      throw std::runtime_error("leading zero");
    while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) ++p_;
    if (p_ < s_.size() && s_[p_] == '.') {
      ++p_;
      if (p_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[p_]))) throw std::runtime_error("bad fraction");
      while (p_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p_]))) ++p_;
    }
    return {std::stod(s_.substr(start, p_ - start))};
  }
  const std::string& s_;
  std::size_t p_ = 0;
};

// A synthetic trace of one worker: `replicas` threads each doing forward/backward of `layers`
// layers per step with a reduction span per bucket on a communication thread, and a driver thread.
std::vector<std::uint8_t> synthetic_worker(std::uint32_t worker, std::size_t replicas, std::size_t steps) {
  constexpr std::size_t layers = 4;
  ls::trace_recorder r(replicas + 1, {.steps = {0, steps}, .events_per_thread = 4096});
  for (std::size_t t = 0; t < replicas; ++t) r.name_thread(t, "replica " + std::to_string(t));
  r.name_thread(replicas, "driver \"main\"");
  for (std::size_t s = 0; s < steps; ++s) {
    r.begin_step(s);
    ls::trace_span step(&r, replicas, "step", "driver", "step", static_cast<std::int64_t>(s));
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < replicas; ++t)
      pool.emplace_back([&r, t] {
        for (std::size_t l = 0; l < layers; ++l) ls::trace_span f(&r, t, "forward", "compute", "layer", static_cast<std::int64_t>(l));
        for (std::size_t l = layers; l-- > 0;) {
          ls::trace_span b(&r, t, "backward", "compute", "layer", static_cast<std::int64_t>(l));
          volatile double x = 0;
          for (int k = 0; k < 200; ++k) x = x + k;
        }
        ls::trace_span o(&r, t, "optimizer", "compute");
      });
    for (auto& p : pool) p.join();
  }
  r.stop();
  return r.serialize(worker);
}

}  // namespace

TEST_CASE("trace file: names that are not valid UTF-8 are written with U+FFFD, so the file stays valid JSON") {
  // what append_json_string does to every name: each byte that does not begin a well-formed
  // sequence becomes \ufffd, well-formed ones pass through
  const std::pair<std::string, std::string> cases[] = {
      {"plain", "\"plain\""},
      {"gr\xc3\xb6\xc3\x9f" "e \xf0\x9f\x98\x80", "\"gr\xc3\xb6\xc3\x9f" "e \xf0\x9f\x98\x80\""},  // 2- and 4-byte forms
      {"a\xff", "\"a\\ufffd\""},                                                // not a lead byte
      {"\xc0\xaf", "\"\\ufffd\\ufffd\""},                                        // overlong '/'
      {"\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\""},                              // a surrogate
      {"x\xe2\x82", "\"x\\ufffd\\ufffd\""},                                       // cut short at the end
      {"\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\""},                  // past U+10FFFF
      {"q\"\\\x01", "\"q\\\"\\\\\\u0001\""}};
  for (const auto& [in, want] : cases) {
    const std::string input = in, expected = want;  // named copies: a lambda of CAPTURE's cannot take a binding
    CAPTURE(input);
    std::string out;
    ls::io::detail::append_json_string(out, input);
    CHECK(out == expected);
    CHECK(ls::io::detail::valid_utf8(out));
    CHECK(ls::io::detail::valid_utf8(input) == (out.find("\\ufffd") == std::string::npos));
  }
  ls::trace_recorder r(2, {.steps = {0, 1}, .events_per_thread = 16});
  r.name_thread(0, "replica \xff\xfe");
  r.name_thread(1, "driver \xc3\xa9");
  r.begin_step(0);
  { ls::trace_span s(&r, 0, "step", "driver"); }
  r.stop();
  const auto w = r.serialize(0);
  const std::vector<ls::io::trace_block> blocks{{w, 0}};
  const std::string text = ls::io::chrome_trace_json(blocks);
  CHECK(ls::io::detail::valid_utf8(text));
  CHECK(text.find("replica \\ufffd\\ufffd") != std::string::npos);
  CHECK(text.find("driver \xc3\xa9") != std::string::npos);
  REQUIRE_NOTHROW((void)json_parser(text).parse());
}

TEST_CASE("trace file: valid Chrome trace-event JSON with metadata, required fields and balanced spans") {
  const auto w0 = synthetic_worker(0, 3, 4);
  const auto w1 = synthetic_worker(1, 2, 4);
  const std::int64_t offset1 = 5'000'000;  // worker 1's clock runs 5 ms behind the chief's
  const std::vector<ls::io::trace_block> blocks{{w0, 0}, {w1, offset1}};
  const std::string text = ls::io::chrome_trace_json(blocks);
  json root;
  REQUIRE_NOTHROW(root = json_parser(text).parse());
  REQUIRE(root.is_object());
  REQUIRE(root.object().count("traceEvents"));
  const auto& events = root.object().at("traceEvents").array();
  std::set<std::pair<int, int>> named_threads;
  std::set<int> named_processes;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> spans;
  std::size_t complete = 0;
  for (const json& e : events) {
    REQUIRE(e.is_object());
    const auto& o = e.object();
    for (const char* field : {"ph", "ts", "pid", "tid", "name", "cat", "args"}) {
      CAPTURE(field);
      REQUIRE(o.count(field));
    }
    CHECK(o.at("args").is_object());
    const std::string ph = o.at("ph").string();
    const int pid = static_cast<int>(o.at("pid").number()), tid = static_cast<int>(o.at("tid").number());
    if (ph == "M") {
      const std::string name = o.at("name").string();
      if (name == "process_name") named_processes.insert(pid);
      if (name == "thread_name") named_threads.insert({pid, tid});
      if (name != "process_sort_index") CHECK(o.at("args").object().at("name").is_string());
      continue;
    }
    REQUIRE(ph == "X");
    REQUIRE(o.count("dur"));
    const double ts = o.at("ts").number(), dur = o.at("dur").number();
    CHECK(dur >= 0);
    if (pid == 1) CHECK(ts >= 5000.0);  // the offset moved worker 1 onto the chief's clock
    spans[{pid, tid}].push_back({ts, ts + dur});
    const std::string name = o.at("name").string();
    if (name == "forward" || name == "backward") CHECK(o.at("args").object().count("layer"));
    ++complete;
  }
  CHECK(named_processes == std::set<int>{0, 1});
  CHECK(named_threads.size() == 4 + 3);
  for (const auto& [key, v] : spans) CHECK(named_threads.count(key));
  CHECK(complete == 4 * (3 * 9 + 1) + 4 * (2 * 9 + 1));
  // balanced: within a thread, sorted by start, two spans are disjoint or one holds the other
  for (auto& [key, v] : spans) {
    std::sort(v.begin(), v.end(), [](auto a, auto b) { return a.first != b.first ? a.first < b.first : a.second > b.second; });
    std::vector<double> open;  // ends of the enclosing spans
    for (const auto& [b, e] : v) {
      while (!open.empty() && open.back() <= b) open.pop_back();
      if (!open.empty()) CHECK(e <= open.back());
      open.push_back(e);
    }
  }
  CHECK(root.object().at("otherData").object().at("dropped_spans").number() == 0);
  CHECK(text.find("driver \\\"main\\\"") != std::string::npos);  // names are escaped
}

TEST_CASE("trace file: written atomically by write_chrome_trace, which returns its size") {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_trace_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ls::trace_recorder r(2, {.steps = {0, 2}, .events_per_thread = 16});
  r.name_thread(0, "replica 0");
  r.begin_step(0);
  { ls::trace_span s(&r, 0, "forward", "compute"); }
  { ls::trace_span s(&r, 1, "reduce", "communication", "bucket", 1); }
  r.stop();
  const auto size = ls::io::write_chrome_trace(dir / "trace.json", r);
  CHECK(size == fs::file_size(dir / "trace.json"));
  std::ifstream in(dir / "trace.json");
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK_NOTHROW((void)json_parser(ss.str()).parse());
  for (const auto& e : fs::directory_iterator(dir)) CHECK(e.path().filename() == "trace.json");  // no temporary left
  // an empty recorder still makes a valid file
  ls::trace_recorder none(1);
  CHECK_NOTHROW((void)json_parser(ls::io::chrome_trace_json(std::vector<ls::io::trace_block>{{none.serialize(0), 0}})).parse());
  // a malformed block is refused
  std::vector<std::uint8_t> junk{1, 2, 3};
  CHECK_THROWS_AS((void)ls::io::chrome_trace_json(std::vector<ls::io::trace_block>{{junk, 0}}), ls::data_error);
  fs::remove_all(dir);
}
