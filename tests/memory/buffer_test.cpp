// Tests of memory/: buffer alignment, ownership and growth, and the host memory resource.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>
#include <type_traits>
#include <utility>

#include <lockstep/memory/buffer.hpp>
#include <lockstep/memory/resource.hpp>

namespace ls = lockstep;

using fbuf = ls::buffer<float, ls::cpu<0>>;
static_assert(!std::is_copy_constructible_v<fbuf> && !std::is_copy_assignable_v<fbuf>);
static_assert(std::is_nothrow_move_constructible_v<fbuf> && std::is_nothrow_move_assignable_v<fbuf>);
static_assert(ls::host_alignment == 64);

namespace {
bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }
}  // namespace

TEST_CASE_TEMPLATE("buffer storage is 64-byte aligned for every size", T, char, std::int32_t, float, double) {
  for (std::size_t n : {1u, 2u, 3u, 7u, 63u, 64u, 65u, 1000u, 4099u}) {
    CAPTURE(n);
    ls::buffer<T, ls::cpu<1>> b(n);
    REQUIRE(b.data() != nullptr);
    CHECK(aligned64(b.data()));
    CHECK(b.size() == n);
    CHECK(!b.empty());
    // every element is writable and readable
    for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<T>(i % 100);
    for (std::size_t i = 0; i < n; ++i) CHECK(b[i] == static_cast<T>(i % 100));
    CHECK(b.span().size() == n);
    CHECK(b.span().data() == b.data());
  }
}

TEST_CASE("an empty buffer holds nothing") {
  fbuf a;
  CHECK(a.data() == nullptr);
  CHECK(a.size() == 0);
  CHECK(a.empty());
  fbuf z(0);
  CHECK(z.data() == nullptr);
  CHECK(z.empty());
  CHECK(ls::memory_resource<ls::cpu<0>>::allocate(0) == nullptr);
  ls::memory_resource<ls::cpu<0>>::deallocate(nullptr, 0);  // a no-op
}

TEST_CASE("buffer moves transfer ownership and empty the source") {
  fbuf a(10);
  for (std::size_t i = 0; i < 10; ++i) a[i] = float(i);
  float* p = a.data();

  fbuf b(std::move(a));
  CHECK(b.data() == p);
  CHECK(b.size() == 10);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  CHECK(a.size() == 0);
  CHECK(b[9] == 9.0f);

  fbuf c(3);
  c = std::move(b);
  CHECK(c.data() == p);
  CHECK(c.size() == 10);
  CHECK(b.empty());

  // self move-assignment keeps the contents
  fbuf& alias = c;
  c = std::move(alias);
  CHECK(c.data() == p);
  CHECK(c.size() == 10);
  CHECK(c[4] == 4.0f);

  // moving an empty buffer into a full one frees the full one's memory and leaves it empty
  c = fbuf{};
  CHECK(c.empty());
  CHECK(c.data() == nullptr);
}

TEST_CASE("reserve_discard grows when asked for more and never shrinks") {
  fbuf b;
  b.reserve_discard(0);
  CHECK(b.empty());
  b.reserve_discard(16);
  CHECK(b.size() == 16);
  const float* p = b.data();
  CHECK(aligned64(p));
  for (std::size_t n : {0u, 1u, 8u, 15u, 16u}) {
    b.reserve_discard(n);
    CHECK(b.size() == 16);
    CHECK(b.data() == p);  // no reallocation
  }
  b.reserve_discard(17);
  CHECK(b.size() >= 17);
  CHECK(aligned64(b.data()));
  const std::size_t grown = b.size();
  b.reserve_discard(1);
  CHECK(b.size() == grown);
}

TEST_CASE("const access sees the same elements") {
  ls::buffer<double, ls::cpu<0>> b(5);
  for (std::size_t i = 0; i < 5; ++i) b[i] = 0.5 * double(i);
  const auto& cb = b;
  CHECK(cb.data() == b.data());
  CHECK(cb[3] == 1.5);
  CHECK(cb.span()[4] == 2.0);
  CHECK(cb.span().size() == 5);
  CHECK(cb.span()[2] == 1.0);
}

TEST_CASE("a borrowed buffer views memory it never frees, moves carry that, reserve_discard makes it owning") {
  std::vector<float> memory(37, 2.5f);
  {
    fbuf b = fbuf::borrowed(memory.data(), memory.size());
    CHECK(!b.owns_memory());
    CHECK(b.data() == memory.data());
    CHECK(b.size() == 37);
    b[36] = 7.0f;
    fbuf c(std::move(b));
    CHECK(!c.owns_memory());
    CHECK(b.owns_memory());  // NOLINT(bugprone-use-after-move): the moved-from state is an empty owning buffer
    CHECK(b.empty());
    fbuf d(4);
    d = std::move(c);  // frees d's own memory, takes the view
    CHECK(!d.owns_memory());
    CHECK(d.data() == memory.data());
    d.reserve_discard(20);  // fits: still the view
    CHECK(!d.owns_memory());
    d.reserve_discard(38);  // grows into memory of its own
    CHECK(d.owns_memory());
    CHECK(d.data() != memory.data());
    CHECK(d.size() == 38);
  }
  // every view is gone and the memory is untouched by their destruction
  CHECK(memory[36] == 7.0f);
  CHECK(memory[0] == 2.5f);
  memory.assign(100, 1.0f);  // and still the vector's to manage
  CHECK(memory.size() == 100);
}
