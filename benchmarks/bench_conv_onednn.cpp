// bench_conv_onednn: oneDNN's convolution and pooling primitives beside lockstep's layers, in the same run,
// on the convolutions of TensorFlow's layers-tutorial CNN at batch 64 with one thread:
//   conv2 = 64 filters 5 x 5, stride 1, padding 2 on 32 x 14 x 14 (and conv1 = 32 filters 5 x 5 on
//   1 x 28 x 28).
// One pass = forward (training) + backward data + backward weights (with the bias gradient), the
// same work as lockstep's forward + backward with dx. gflops counts the same useful flops as
// bench_conv (3 x 2 OH OW F C K^2 per image) and fraction_of_sgemm_peak divides by the best
// OpenBLAS sgemm rate measured in this run.
//
// oneDNN is measured two ways, primitives created once, memory allocated and filled once:
//   impl=onednn       the layouts oneDNN picks (format_tag::any: blocked, e.g. nChw16c); the
//                     reorders from and to NCHW are not timed, as in a network that stays blocked
//   impl=onednn_nchw  plain NCHW / OIHW tensors, lockstep's layouts
// Times are the calling thread's CPU time, the median of several repeats after a warm-up. oneDNN
// runs on OpenMP: the benchmark asks for one OpenMP thread (omp_set_num_threads when OpenMP is
// linked; otherwise run it with OMP_NUM_THREADS=1). Not part of the library: a yardstick only.
//
// Also its two max_pool2d<2> layers (pool1 on 32 x 28 x 28, pool2 on 64 x 14 x 14) beside
// oneDNN's max pooling primitives, forward training + backward, in nChw16c and in NCHW.
//
// Prints `openblas_core=... cpu=...`, `onednn_version=... onednn_isa=...`, the sgemm lines, then per
// layer and implementation
//   layer=<conv1|conv2> impl=<lockstep|onednn|onednn_nchw> gflops=<n> fraction_of_sgemm_peak=<f> ms=<t> ...
//   layer=<pool1|pool2> impl=<lockstep|onednn|onednn_nchw> ms=<t> forward_ms=<t> backward_ms=<t>
//   layer=<...> onednn_over_lockstep=<x>   (oneDNN's speed over lockstep's, > 1: oneDNN faster)
// Options: --repeats N (default 15).

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>
#ifdef LOCKSTEP_BENCH_OPENMP
#include <omp.h>
#endif

#include <fmt/core.h>

#include <lockstep/layers/conv.hpp>
#include <lockstep/lockstep.hpp>

#include "conv_bench_common.hpp"

namespace {

namespace ls = lockstep;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

// A memory object of descriptor md filled with values in [-0.5, 0.5).
dnnl::memory filled(const dnnl::memory::desc& md, const dnnl::engine& eng, unsigned stream) {
  dnnl::memory m(md, eng);
  auto* p = static_cast<float*>(m.get_data_handle());
  const std::size_t n = md.get_size() / sizeof(float);
  const ls::counter_rng rng(17, stream);
  for (std::size_t i = 0; i < n; ++i) p[i] = rng.uniform(i) - 0.5f;
  return m;
}

// Times forward + backward data + backward weights of one convolution (C -> F channels, K x K,
// stride 1, padding Pd, H x W images, batch N) with oneDNN; `blocked`: format_tag::any, else NCHW.
conv_bench::pass_times time_onednn(int n, int c, int h, int w, int f, int k, int pad, bool blocked, int repeats,
                                   const char* name) {
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  const int oh = h + 2 * pad - k + 1, ow = w + 2 * pad - k + 1;
  const dnnl::memory::dims src_dims{n, c, h, w}, wei_dims{f, c, k, k}, bias_dims{f}, dst_dims{n, f, oh, ow};
  const dnnl::memory::dims strides{1, 1}, padding{pad, pad};
  const tag act = blocked ? tag::any : tag::nchw, wei = blocked ? tag::any : tag::oihw;
  const dnnl::memory::desc src_md(src_dims, dt::f32, act), wei_md(wei_dims, dt::f32, wei),
      bias_md(bias_dims, dt::f32, tag::x), dst_md(dst_dims, dt::f32, act);

  const dnnl::convolution_forward::primitive_desc fwd_pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_md,
                                      wei_md, bias_md, dst_md, strides, padding, padding),
      eng);
  const dnnl::convolution_backward_data::primitive_desc bwd_data_pd(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_md, wei_md, dst_md, strides,
                                            padding, padding),
      eng, fwd_pd);
  const dnnl::convolution_backward_weights::primitive_desc bwd_wei_pd(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, src_md, wei_md, bias_md, dst_md,
                                               strides, padding, padding),
      eng, fwd_pd);
  fmt::print("onednn layer={} layout={} forward={} backward_data={} backward_weights={}\n", name,
             blocked ? "any" : "nchw", fwd_pd.impl_info_str(), bwd_data_pd.impl_info_str(),
             bwd_wei_pd.impl_info_str());

  // Each primitive gets its memory in the layouts it chose (filled directly: the values do not
  // matter for the time, and no reorder is timed).
  dnnl::memory src = filled(fwd_pd.src_desc(), eng, 1), weights = filled(fwd_pd.weights_desc(), eng, 2);
  dnnl::memory bias = filled(fwd_pd.bias_desc(), eng, 3), dst(fwd_pd.dst_desc(), eng);
  dnnl::memory diff_dst_d = filled(bwd_data_pd.diff_dst_desc(), eng, 4);
  dnnl::memory weights_d = filled(bwd_data_pd.weights_desc(), eng, 5), diff_src(bwd_data_pd.diff_src_desc(), eng);
  dnnl::memory src_w = filled(bwd_wei_pd.src_desc(), eng, 6), diff_dst_w = filled(bwd_wei_pd.diff_dst_desc(), eng, 7);
  dnnl::memory diff_weights(bwd_wei_pd.diff_weights_desc(), eng), diff_bias(bwd_wei_pd.diff_bias_desc(), eng);
  auto scratch = [&](const dnnl::primitive_desc_base& pd) { return dnnl::memory(pd.scratchpad_desc(), eng); };
  dnnl::memory s_fwd = scratch(fwd_pd), s_bd = scratch(bwd_data_pd), s_bw = scratch(bwd_wei_pd);

  const dnnl::convolution_forward fwd(fwd_pd);
  const dnnl::convolution_backward_data bwd_data(bwd_data_pd);
  const dnnl::convolution_backward_weights bwd_wei(bwd_wei_pd);
  const std::unordered_map<int, dnnl::memory> fwd_args{{DNNL_ARG_SRC, src},
                                                       {DNNL_ARG_WEIGHTS, weights},
                                                       {DNNL_ARG_BIAS, bias},
                                                       {DNNL_ARG_DST, dst},
                                                       {DNNL_ARG_SCRATCHPAD, s_fwd}};
  const std::unordered_map<int, dnnl::memory> bd_args{{DNNL_ARG_DIFF_DST, diff_dst_d},
                                                      {DNNL_ARG_WEIGHTS, weights_d},
                                                      {DNNL_ARG_DIFF_SRC, diff_src},
                                                      {DNNL_ARG_SCRATCHPAD, s_bd}};
  const std::unordered_map<int, dnnl::memory> bw_args{{DNNL_ARG_SRC, src_w},
                                                      {DNNL_ARG_DIFF_DST, diff_dst_w},
                                                      {DNNL_ARG_DIFF_WEIGHTS, diff_weights},
                                                      {DNNL_ARG_DIFF_BIAS, diff_bias},
                                                      {DNNL_ARG_SCRATCHPAD, s_bw}};
  auto forward = [&] {
    fwd.execute(st, fwd_args);
    st.wait();
  };
  auto backward = [&] {
    bwd_data.execute(st, bd_args);
    bwd_wei.execute(st, bw_args);
    st.wait();
  };
  return conv_bench::time_passes(forward, backward, repeats);
}

// Times max pooling over 2 x 2 windows moved by 2 (forward training, with oneDNN's workspace of
// the maxima's positions, then backward) on C x H x W images, batch N, with oneDNN; `blocked`:
// nChw16c (as in a network that stays blocked from the convolution on), else NCHW.
conv_bench::pass_times time_onednn_pool(int n, int c, int h, int w, bool blocked, int repeats, const char* name) {
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  const tag act = blocked ? tag::nChw16c : tag::nchw;
  const dnnl::memory::desc src_md({n, c, h, w}, dt::f32, act), dst_md({n, c, h / 2, w / 2}, dt::f32, act);
  const dnnl::memory::dims window{2, 2}, none{0, 0};
  const dnnl::pooling_forward::primitive_desc fwd_pd(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, src_md, dst_md,
                                  window, window, none, none),
      eng);
  const dnnl::pooling_backward::primitive_desc bwd_pd(
      dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, src_md, dst_md, window, window, none, none), eng,
      fwd_pd);
  fmt::print("onednn layer={} layout={} forward={} backward={}\n", name, blocked ? "nChw16c" : "nchw",
             fwd_pd.impl_info_str(), bwd_pd.impl_info_str());
  dnnl::memory src = filled(fwd_pd.src_desc(), eng, 1), dst(fwd_pd.dst_desc(), eng);
  dnnl::memory workspace(fwd_pd.workspace_desc(), eng), diff_dst = filled(bwd_pd.diff_dst_desc(), eng, 2);
  dnnl::memory diff_src(bwd_pd.diff_src_desc(), eng);
  const dnnl::pooling_forward fwd(fwd_pd);
  const dnnl::pooling_backward bwd(bwd_pd);
  auto forward = [&] {
    fwd.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}, {DNNL_ARG_WORKSPACE, workspace}});
    st.wait();
  };
  auto backward = [&] {
    bwd.execute(st, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src}, {DNNL_ARG_WORKSPACE, workspace}});
    st.wait();
  };
  return conv_bench::time_passes(forward, backward, repeats);
}

// lockstep's max_pool2d<2> on C x H x W images beside oneDNN's pooling primitives, blocked and NCHW.
template <std::size_t C, std::size_t H, std::size_t W>
void compare_pool(const char* name, int n, int repeats) {
  const conv_bench::pass_times ours =
      conv_bench::time_lockstep_layer<ls::max_pool2d<2>, ls::shape<C, H, W>>(static_cast<std::size_t>(n), repeats);
  const int c = static_cast<int>(C), h = static_cast<int>(H), w = static_cast<int>(W);
  const conv_bench::pass_times blocked = time_onednn_pool(n, c, h, w, true, repeats, name);
  const conv_bench::pass_times plain = time_onednn_pool(n, c, h, w, false, repeats, name);
  for (const auto& [impl, t] : {std::pair{"lockstep", ours}, std::pair{"onednn", blocked}, std::pair{"onednn_nchw", plain}})
    fmt::print("layer={} impl={} ms={:.3f} forward_ms={:.3f} backward_ms={:.3f}\n", name, impl, t.total * 1e3,
               t.forward * 1e3, t.backward * 1e3);
  fmt::print("layer={} onednn_over_lockstep={:.2f} onednn_nchw_over_lockstep={:.2f}\n", name, ours.total / blocked.total,
             ours.total / plain.total);
  std::fflush(stdout);
}

template <class L, class S>
void compare(const char* name, int n, int c, int h, int w, int f, int k, int pad, int repeats, double peak) {
  const double flops = conv_bench::conv_flops(static_cast<std::size_t>(n), static_cast<std::size_t>(c),
                                              static_cast<std::size_t>(f), static_cast<std::size_t>(k),
                                              static_cast<std::size_t>(h + 2 * pad - k + 1),
                                              static_cast<std::size_t>(w + 2 * pad - k + 1));
  const conv_bench::pass_times ours = conv_bench::time_lockstep_layer<L, S>(static_cast<std::size_t>(n), repeats);
  const conv_bench::pass_times blocked = time_onednn(n, c, h, w, f, k, pad, true, repeats, name);
  const conv_bench::pass_times plain = time_onednn(n, c, h, w, f, k, pad, false, repeats, name);
  conv_bench::print_layer(name, "lockstep", flops, ours, peak);
  conv_bench::print_layer(name, "onednn", flops, blocked, peak);
  conv_bench::print_layer(name, "onednn_nchw", flops, plain, peak);
  fmt::print("layer={} onednn_over_lockstep={:.2f} onednn_nchw_over_lockstep={:.2f}\n", name, ours.total / blocked.total,
             ours.total / plain.total);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 15;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--repeats N]\n", argv[0]);
      return 2;
    }
  }
  try {
#ifdef LOCKSTEP_BENCH_OPENMP
    omp_set_num_threads(1);
    const int omp_threads = omp_get_max_threads();
#else
    const int omp_threads = -1;  // unknown: set OMP_NUM_THREADS=1
#endif
    conv_bench::print_machine();
    const dnnl_version_t* v = dnnl_version();
    fmt::print("onednn_version={}.{}.{} onednn_isa={} omp_threads={}\n", v->major, v->minor, v->patch,
               isa_name(dnnl::get_effective_cpu_isa()), omp_threads);
    const double peak = conv_bench::sgemm_peak(repeats);
    compare<ls::conv2d<64, 5, 1, 2>, ls::shape<32, 14, 14>>("conv2", 64, 32, 14, 14, 64, 5, 2, repeats, peak);
    compare<ls::conv2d<32, 5, 1, 2>, ls::shape<1, 28, 28>>("conv1", 64, 1, 28, 28, 32, 5, 2, repeats, peak);
    compare_pool<32, 28, 28>("pool1", 64, repeats);
    compare_pool<64, 14, 14>("pool2", 64, repeats);
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "bench_conv_onednn: oneDNN: %s (status %d)\n", e.what(), static_cast<int>(e.status));
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv_onednn: %s\n", e.what());
    return 1;
  }
  return 0;
}
