// The softmax cross-entropy pieces of backend/softmax_xent.hpp on the host, split the way the
// CUDA kernel splits a row (32 lanes, each taking every 32nd column, combined with xor
// butterflies) and as one part (the host's row), against a double reference: the device runs
// exactly these LOCKSTEP_HD functions, so this is its formula checked without a GPU.

#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <lockstep/backend/softmax_xent.hpp>

#include "losses/xent_reference.hpp"

namespace {

namespace bd = lockstep::backend::detail;

struct row_result {
  float loss = 0;
  float hit = 0;
  std::vector<float> grad;
};

// Row z with label y computed by `lanes` parts combined as the kernel's xor shuffles do: after
// each round every lane holds combine(its value, the value of lane ^ off).
row_result by_lanes(const std::vector<float>& z, std::int32_t y, std::size_t lanes) {
  const std::size_t cols = z.size();
  std::vector<bd::xent_max<float>> mx(lanes, bd::xent_max<float>{0.0f, 0});
  for (std::size_t l = 0; l < lanes; ++l) mx[l] = bd::xent_max_part(z.data(), cols, l, lanes);
  for (std::size_t off = lanes / 2; off > 0; off /= 2) {
    std::vector<bd::xent_max<float>> next = mx;
    for (std::size_t l = 0; l < lanes; ++l) next[l] = bd::xent_max_combine(mx[l], mx[l ^ off]);
    mx = next;
  }
  for (std::size_t l = 1; l < lanes; ++l) {  // every lane agrees on the maximum and its column
    CHECK((mx[l].value == mx[0].value || (std::isnan(mx[l].value) && std::isnan(mx[0].value))));
    CHECK(mx[l].arg == mx[0].arg);
  }
  std::vector<float> t(lanes);
  for (std::size_t l = 0; l < lanes; ++l) t[l] = bd::xent_t_part(z.data(), cols, l, lanes, mx[l].value, mx[l].arg);
  for (std::size_t off = lanes / 2; off > 0; off /= 2) {
    std::vector<float> next = t;
    for (std::size_t l = 0; l < lanes; ++l) next[l] = t[l] + t[l ^ off];
    t = next;
  }
  row_result r;
  r.grad.assign(cols, 0.0f);
  for (std::size_t l = 0; l < lanes; ++l)
    bd::xent_grad_part(z.data(), cols, l, lanes, y, mx[l].value, mx[l].arg, t[l], r.grad.data());
  r.loss = bd::xent_row_loss(z.data(), cols, y, mx[0].value, t[0]);
  r.hit = bd::xent_label_valid(y, cols) && static_cast<std::size_t>(y) == mx[0].arg ? 1.0f : 0.0f;
  return r;
}

// Row z with label y through the host's row operation (one part).
row_result by_row_op(const std::vector<float>& z, std::int32_t y) {
  row_result r;
  r.grad.assign(z.size(), 0.0f);
  bd::softmax_xent_row_op<float>{z.data(), &y, r.grad.data(), &r.loss, &r.hit, z.size()}(0);
  return r;
}

// The first arg-max of z.
std::size_t first_argmax(const std::vector<float>& z) {
  std::size_t a = 0;
  for (std::size_t c = 1; c < z.size(); ++c)
    if (z[c] > z[a]) a = c;
  return a;
}

}  // namespace

TEST_CASE("backend: softmax_xent pieces, split as the GPU splits a row or not, match a double reference") {
  std::vector<std::vector<float>> rows = xent_ref::confident_rows();
  for (auto& z : xent_ref::wide_rows()) rows.push_back(std::move(z));
  for (const auto& z : rows) {
    CAPTURE(z.size());
    CAPTURE(z[0]);
    for (std::int32_t y : {std::int32_t(0), std::int32_t(z.size() / 2), std::int32_t(z.size() - 1)}) {
      CAPTURE(y);
      for (const std::size_t lanes : {std::size_t(1), std::size_t(32)}) {
        CAPTURE(lanes);
        const row_result r = lanes == 1 ? by_row_op(z, y) : by_lanes(z, y, lanes);
        xent_ref::check_row(r.loss, r.grad, z, y, 1e-5);
        CHECK(r.hit == (first_argmax(z) == std::size_t(y) ? 1.0f : 0.0f));
      }
    }
  }
}

TEST_CASE("backend: the host's softmax_xent row, each exp computed once, gives the bits of the parts it fuses") {
  std::vector<std::vector<float>> rows = xent_ref::confident_rows();
  for (auto& z : xent_ref::wide_rows()) rows.push_back(std::move(z));
  rows.push_back({0.25f});                          // one class
  rows.push_back({2.0f, 2.0f, -1.0f, 2.0f});         // ties at the maximum
  rows.push_back({1.0f, NAN, 2.0f});                 // a NaN logit
  rows.push_back({1.0f, INFINITY, -3.0f});           // an infinite maximum
  rows.push_back({-INFINITY, -INFINITY});            // no finite logit
  const auto same_bits = [](float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); };
  for (const auto& z : rows) {
    const std::size_t cols = z.size();
    CAPTURE(cols);
    for (const std::int32_t y : {std::int32_t(-1), std::int32_t(0), std::int32_t(cols / 2), std::int32_t(cols - 1),
                                 std::int32_t(cols)}) {
      CAPTURE(y);
      // The parts, as one part (what the row computed before, and the device's formula).
      const bd::xent_max<float> mx = bd::xent_max_part(z.data(), cols, 0, 1);
      const float t = bd::xent_t_part(z.data(), cols, 0, 1, mx.value, mx.arg);
      std::vector<float> grad(cols, 0.0f);
      bd::xent_grad_part(z.data(), cols, 0, 1, y, mx.value, mx.arg, t, grad.data());
      const float loss = bd::xent_row_loss(z.data(), cols, y, mx.value, t);
      const row_result r = by_row_op(z, y);
      CHECK(same_bits(r.loss, loss));
      for (std::size_t c = 0; c < cols; ++c) CHECK(same_bits(r.grad[c], grad[c]));
      row_result no_grad;  // without a gradient the row sums t alone: the same loss
      bd::softmax_xent_row_op<float>{z.data(), &y, nullptr, &no_grad.loss, &no_grad.hit, cols}(0);
      CHECK(same_bits(no_grad.loss, loss));
      CHECK(no_grad.hit == r.hit);
    }
  }
}

TEST_CASE("backend: softmax_xent keeps the loss of a nearly certain row (log1p, not log of a rounded 1 + t)") {
  // t = e^-16 is below float's epsilon: log(1 + t) rounded would be 0 or 1.19e-7, not 1.125e-7.
  const std::vector<float> z{16.0f, 0.0f};
  const row_result r = by_lanes(z, 0, 32);
  const double t = std::exp(-16.0);
  CHECK(std::abs(r.loss - std::log1p(t)) <= 1e-6 * std::log1p(t));
  CHECK(std::abs(r.grad[0] - (-t / (1 + t))) <= 1e-6 * t);  // -t / (1 + t), not 1 / (1 + t) - 1
  CHECK(std::abs(r.grad[1] - t / (1 + t)) <= 1e-6 * t);
}

TEST_CASE("backend: softmax_xent marks a bad label or a maximum that is not finite with a NaN loss") {
  const std::vector<float> z{1.0f, 2.0f, 3.0f};
  CHECK(std::isnan(by_lanes(z, 3, 32).loss));
  CHECK(std::isnan(by_lanes(z, -1, 32).loss));
  CHECK(by_lanes(z, 3, 32).hit == 0.0f);
  CHECK(std::isnan(by_lanes({1.0f, INFINITY}, 0, 32).loss));
  CHECK(std::isnan(by_lanes({1.0f, NAN, 2.0f}, 0, 32).loss));
  CHECK(std::isnan(by_row_op({-INFINITY, -INFINITY}, 0).loss));
}
