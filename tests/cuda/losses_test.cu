// Softmax cross-entropy on the device against the double reference, on confident
// (large-margin) rows: the same check as tests/losses runs on the host backend.
#include "gpu_test.hpp"

#include <cstdint>
#include <utility>
#include <vector>

#include "../losses/xent_reference.hpp"

using namespace lockstep_test;

TEST_CASE("gpu: softmax cross-entropy of confident rows matches a double reference") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::cuda_context ctx(0);
  auto rows = xent_ref::confident_rows();
  for (auto& z : xent_ref::wide_rows()) rows.push_back(std::move(z));  // several columns per lane
  for (const auto& z : rows) {
    CAPTURE(z.size());
    CAPTURE(z[0]);
    auto d_z = to_device(ctx, z);
    ls::buffer<float, ls::gpu<0>> d_grad(z.size()), d_scratch(ls::softmax_cross_entropy::scratch_per_row);
    for (std::int32_t y = 0; y < std::int32_t(z.size()); y += z.size() > 16 ? 7 : 1) {
      CAPTURE(y);
      auto d_label = to_device(ctx, std::vector<std::int32_t>{y});
      const ls::loss_sum l = xent_ref::evaluate_cols(ls::softmax_cross_entropy{}, ctx, d_z.data(), 1, z.size(), ls::targets<float>{d_label.data(), nullptr, 0}, d_grad.data(), d_scratch.data());
      xent_ref::check_row(l.sum, to_host(ctx, d_grad.data(), z.size()), z, y);
    }
  }
}
