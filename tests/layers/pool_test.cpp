// Max and average pooling's host loops (a constant geometry, branch-free selects, one call per
// row) against the per-element kernels that other devices run, bit for bit, over geometries with
// and without overlap, padding and dropped rows, on inputs full of ties, signed zeros and NaNs.
// Also built with -O3 -mavx2 (layers/conv_avx2), where g++ 12 has miscompiled such loops before.
// The 2 x 2 pooling loops for AVX2 (backend/host/pool_2x2.hpp) are checked the same way.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/layers/conv.hpp>
#include <lockstep/lockstep.hpp>
#include <lockstep/testing/drive.hpp>

namespace ls = lockstep;

namespace {

template <class L, std::size_t... Dims>
using bound = ls::bind_shape_t<L, ls::shape<Dims...>>;

enum class pool { max, avg };

/// The value of the guard element past an output's rows.
constexpr float pool_guard = 12345.0f;

/// n elements of `fill` and a guard element after them: nothing may be written beyond the rows.
std::vector<float> guarded(std::size_t n, float fill) {
  std::vector<float> v(n + 1, fill);
  v.back() = pool_guard;
  return v;
}

/// Checks the guard element after an output's rows, then drops it.
void drop_guard(std::vector<float>& v) {
  CHECK(v.back() == pool_guard);
  v.pop_back();
}

/// drop_guard for each output.
template <class... V>
void drop_guards(V&... outputs) {
  (drop_guard(outputs), ...);
}

/// max_pool2d or avg_pool2d<K, S, P> on float images of shape<C, H, W> at `rows` rows, through the
/// layer on the host (its row loops with a constant geometry) against the per-element kernels
/// that other devices run (max_pool_op, max_pool_grad_op and its per-element form, avg_pool_op
/// and avg_pool_grad_op), called one index at a time: y, max pooling's argmax cells (bytes in its
/// workspace) and dx equal bit for bit. Inputs
/// and output gradients drawn from few values (ties everywhere), with signed zeros and NaNs
/// sprinkled in, so the first-maximum rule, NaN handling and the sign of zero sums are exercised;
/// the per-element kernel against the rule written out (a window holding a NaN gives its first NaN).
template <pool Kind, std::size_t K, std::size_t S, std::size_t P, std::size_t C, std::size_t H, std::size_t W>
std::size_t check_pool_rows_match(std::size_t rows) {
  using L = std::conditional_t<Kind == pool::max, ls::max_pool2d<K, S, P>, ls::avg_pool2d<K, S, P>>;
  using B = bound<L, C, H, W>;
  constexpr ls::detail::window2d g = B::geometry();
  CAPTURE(Kind == pool::max);
  CAPTURE(K);
  CAPTURE(S);
  CAPTURE(P);
  CAPTURE(H);
  CAPTURE(W);
  CAPTURE(rows);
  std::size_t windows_with_nan = 0;  // max pooling's windows holding a NaN (returned)
  const ls::counter_rng rng(K * 100 + S * 10 + P, rows);
  auto draw = [&](std::size_t i) {
    const std::uint32_t r = rng.u32(i) % 23;
    return r == 0 ? std::nanf("") : r == 1 ? -0.0f : r == 2 ? 0.0f : static_cast<float>(r % 4) - 2.0f;
  };
  std::vector<float> x(rows * B::input_size), dy(rows * B::output_size);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = draw(i);
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = draw(x.size() + i) * 0.375f;
  ls::host_context ctx{1};
  std::vector<float> y = guarded(dy.size(), -7.0f), ws = guarded(rows * B::workspace_per_sample, -7.0f),
                     dx = guarded(x.size(), -7.0f);
  const ls::pass_info info{.training = true};
  lockstep::testing::run_forward<B>(ctx, static_cast<const float*>(nullptr), x.data(), y.data(), ws.data(), rows, info);
  lockstep::testing::run_backward<B>(ctx, static_cast<const float*>(nullptr), x.data(), y.data(), dy.data(), dx.data(),
                                     static_cast<float*>(nullptr), ws.data(), rows, info);
  drop_guards(y, ws, dx);
  std::vector<float> y_ref(y.size(), 7.0f), dx_ref(dx.size(), 7.0f);
  // The cells the workspace holds (max pooling: one per output, rounded up to whole floats).
  using cell = ls::detail::pool_cell_t<K>;
  const std::size_t cells = Kind == pool::max ? rows * B::output_size : 0;
  static_assert(B::workspace_per_sample == (Kind == pool::max ? (B::output_size * sizeof(cell) + 3) / 4 : 0));
  static_assert(sizeof(cell) == (K * K <= 256 ? 1 : 2));
  std::vector<cell> ws_ref(cells, cell{7});
  if constexpr (Kind == pool::max) {
    const ls::detail::max_pool_op<float, cell> fwd{x.data(), y_ref.data(), ws_ref.data(), g};
    for (std::size_t i = 0; i < y.size(); ++i) fwd(i);
    const ls::detail::max_pool_grad_op<float, cell> bwd{dy.data(), ws_ref.data(), dx_ref.data(), g};
    for (std::size_t i = 0; i < rows * C * H; ++i) bwd(i);
    // The GPU's form, one call per input element, gives the same bits.
    std::vector<float> dx_element(dx.size(), 5.0f);
    const ls::detail::max_pool_grad_element_op<float, g, cell> by_element{dy.data(), ws_ref.data(), dx_element.data()};
    for (std::size_t i = 0; i < dx_element.size(); ++i) by_element(i);
    CHECK(dx_element.size() == dx_ref.size());
    CHECK((dx_element.empty() || std::memcmp(dx_element.data(), dx_ref.data(), dx_ref.size() * sizeof(float)) == 0));
    // The kernels' rule, written out: a window's first NaN (row-major) when it holds one, else its
    // first maximum; padding cells never count.
    std::size_t mismatches = 0, nan_windows = 0;
    for (std::size_t o = 0; o < y_ref.size(); ++o) {
      const std::size_t ox = o % g.ow, oy = (o / g.ow) % g.oh, bc = o / (g.ow * g.oh);
      bool any = false, nan = false;
      float best = 0;
      std::size_t at = 0;
      for (std::size_t kr = 0; kr < K && !nan; ++kr)
        for (std::size_t kc = 0; kc < K && !nan; ++kc) {
          const long yy = g.in_row(oy, kr), xx = g.in_col(ox, kc);
          if (yy < 0 || xx < 0 || yy >= static_cast<long>(H) || xx >= static_cast<long>(W)) continue;
          const float v = x[bc * H * W + static_cast<std::size_t>(yy) * W + static_cast<std::size_t>(xx)];
          if (std::isnan(v) || !any || v > best) {
            best = v;
            at = kr * K + kc;
            any = true;
            nan = std::isnan(v);
          }
        }
      nan_windows += nan ? 1 : 0;
      const bool same_value = nan ? std::isnan(y_ref[o]) : std::memcmp(&best, &y_ref[o], sizeof(float)) == 0;
      mismatches += same_value && static_cast<std::size_t>(ws_ref[o]) == at ? 0 : 1;
    }
    CAPTURE(nan_windows);
    CHECK(mismatches == 0);
    windows_with_nan = nan_windows;
  } else {
    const ls::detail::avg_pool_op<float> fwd{x.data(), y_ref.data(), g};
    for (std::size_t i = 0; i < y.size(); ++i) fwd(i);
    const ls::detail::avg_pool_grad_op<float> bwd{dy.data(), dx_ref.data(), g};
    for (std::size_t i = 0; i < rows * C * H; ++i) bwd(i);
  }
  auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  };
  auto same_cells = [&](const std::vector<float>& w) {  // the cells at the start of workspace w
    return cells == 0 || std::memcmp(w.data(), ws_ref.data(), cells * sizeof(cell)) == 0;
  };
  // Every cell lies in its window.
  CHECK(std::all_of(ws_ref.begin(), ws_ref.end(), [](cell c) { return static_cast<std::size_t>(c) < K * K; }));
  CHECK(same_bits(y, y_ref));
  CHECK(same_cells(ws));
  CHECK(same_bits(dx, dx_ref));
  // The row loops called directly: where the layer ran the AVX2 loops of 2 x 2 windows above,
  // these are what CPUs without AVX2 run.
  std::vector<float> y_rows = guarded(y.size(), 3.0f), ws_rows = guarded(ws.size(), 3.0f),
                     dx_rows = guarded(dx.size(), 3.0f);
  if constexpr (Kind == pool::max) {
    auto* at = reinterpret_cast<cell*>(ws_rows.data());
    const ls::detail::max_pool_rows_op<float, g, cell> fwd{x.data(), y_rows.data(), at};
    for (std::size_t i = 0; i < rows * C * g.oh; ++i) fwd(i);
    const ls::detail::max_pool_grad_rows_op<float, g, cell> bwd{dy.data(), at, dx_rows.data()};
    for (std::size_t i = 0; i < rows * C * H; ++i) bwd(i);
  } else {
    const ls::detail::avg_pool_rows_op<float, g> fwd{x.data(), y_rows.data()};
    for (std::size_t i = 0; i < rows * C * g.oh; ++i) fwd(i);
    const ls::detail::avg_pool_grad_rows_op<float, g> bwd{dy.data(), dx_rows.data()};
    for (std::size_t i = 0; i < rows * C * H; ++i) bwd(i);
  }
  drop_guards(y_rows, ws_rows, dx_rows);
  CHECK(same_bits(y_rows, y_ref));
  CHECK(same_cells(ws_rows));
  CHECK(same_bits(dx_rows, dx_ref));
  return windows_with_nan;
}

template <std::size_t K, std::size_t S, std::size_t P, std::size_t C, std::size_t H, std::size_t W>
std::size_t check_pool_rows_match_batches() {
  std::size_t windows_with_nan = 0;
  for (const std::size_t rows : {0, 1, 3}) {
    windows_with_nan += check_pool_rows_match<pool::max, K, S, P, C, H, W>(rows);
    check_pool_rows_match<pool::avg, K, S, P, C, H, W>(rows);
  }
  return windows_with_nan;
}

}  // namespace

TEST_CASE("max_pool2d and avg_pool2d: the host's row loops give the bits of the per-element kernels, ties, signed zeros and NaNs included") {
  // 2 x 2 windows moved by 2 run the AVX2 pooling loops where the CPU has them (eight windows per
  // vector, a masked tail): rows of 1 to 17 windows, odd sizes dropping a row and a column.
  const std::string loops = ls::backend::host_pool_avx2() ? "AVX2 (eight windows per vector)" : "row loops";
  MESSAGE("2 x 2 pooling's host loops: " << loops);
  std::size_t nan_windows = 0;  // max pooling's windows holding a NaN, over every geometry
  nan_windows += check_pool_rows_match_batches<2, 2, 0, 3, 28, 28>();  // the tutorial CNN's pooling
  nan_windows += check_pool_rows_match_batches<2, 2, 0, 2, 14, 14>();  // its second pooling: 7 windows a row, all in the tail
  nan_windows += check_pool_rows_match_batches<2, 2, 0, 2, 16, 17>();  // 8 windows a row, no tail, a dropped column
  nan_windows += check_pool_rows_match_batches<2, 2, 0, 1, 35, 34>();  // 17 windows a row, a dropped row
  nan_windows += check_pool_rows_match_batches<2, 2, 0, 1, 2, 2>();    // one window
  nan_windows += check_pool_rows_match_batches<2, 2, 0, 2, 3, 3>();    // one window, a dropped row and column
  nan_windows += check_pool_rows_match_batches<2, 2, 0, 2, 7, 5>();    // a dropped last row and column
  nan_windows += check_pool_rows_match_batches<3, 3, 0, 2, 11, 13>();  // a dropped last row and column of a wider window
  nan_windows += check_pool_rows_match_batches<2, 3, 0, 3, 8, 8>();    // a stride beyond the kernel: rows and columns no window reads
  nan_windows += check_pool_rows_match_batches<1, 2, 0, 1, 5, 5>();    // 1 x 1 windows
  nan_windows += check_pool_rows_match_batches<5, 5, 0, 1, 5, 5>();    // one window, the whole image
  nan_windows += check_pool_rows_match_batches<3, 2, 0, 2, 7, 5>();    // overlapping windows
  nan_windows += check_pool_rows_match_batches<3, 2, 1, 2, 7, 5>();    // padded
  nan_windows += check_pool_rows_match_batches<2, 1, 0, 1, 5, 6>();    // stride 1
  nan_windows += check_pool_rows_match_batches<2, 3, 1, 3, 7, 8>();    // padded, stride beyond the kernel
  nan_windows += check_pool_rows_match_batches<3, 1, 2, 1, 4, 3>();    // windows mostly in the padding
  nan_windows += check_pool_rows_match_batches<17, 2, 3, 1, 19, 18>();  // 289 cells a window: two bytes a cell
  CHECK(nan_windows > 100);  // the NaN rule was exercised (about 1 input in 23 is a NaN)
}

