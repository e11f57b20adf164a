#pragma once
/// @file onednn_conv.hpp
/// 2-d convolutions through oneDNN's primitives, in the LOCKSTEP_HOST_GEMM=onednn build, on fp32
/// operands or, under mixed<bf16> on CPUs with bf16 instructions, on bf16 operands (rounded to
/// nearest even by the reorders) with fp32 sums, outputs and gradients: forward, backward-data and
/// backward-weights, each in the memory layouts oneDNN chooses
/// (format_tag::any: channel-blocked on AVX2 and AVX-512 CPUs), with reorders from and to
/// lockstep's NCHW images and OIHW filters at the layer's boundary. The primitives, their reorders,
/// the buffers in oneDNN's layouts and one scratchpad are created on the first call of each shape
/// (batch included) and kept by the replica's host_context, so a steady-state step allocates
/// nothing of lockstep's.

#include <oneapi/dnnl/dnnl.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>

#include <lockstep/backend/host/onednn_gemm.hpp>

namespace lockstep::backend::detail {

/// The geometry of one convolution call: n images of c x h x w, f filters of c x k x k, the same
/// stride and zero padding on every side, and the output's oh x ow; bf16 when the primitives read
/// their operands (images, filters, output gradients) in bf16.
struct conv_geometry {
  std::size_t n, c, h, w, f, k, stride, pad, oh, ow;  ///< as above
  bool bf16 = false;                                   ///< bf16 operands, fp32 sums and results
  bool src16 = false;  ///< the caller's images are bf16 encodings (NCHW), not fp32
  /// Same call shape.
  bool operator==(const conv_geometry&) const = default;
};

/// The oneDNN convolution primitives of one host context, one set per conv_geometry. Not safe for
/// concurrent use: like its context, it belongs to one replica thread at a time.
class onednn_conv_cache {
public:
  /// A cache with a CPU engine and stream and no primitives yet.
  onednn_conv_cache() = default;

  onednn_conv_cache(const onednn_conv_cache&) = delete;
  onednn_conv_cache& operator=(const onednn_conv_cache&) = delete;
  ~onednn_conv_cache() = default;

  /// True when the convolutions of shape g run here: always for fp32 (a failure to create them is
  /// an error); for bf16 where bf16 runs natively (onednn_native_bf16) and oneDNN has primitives for g
  /// (else the caller computes the convolution its own way). The first call per shape creates
  /// the primitives, for `threads` threads (the context's budget, as forward and backward run them:
  /// oneDNN's kernels keep the split they were created with).
  bool available(int threads, const conv_geometry& g) {
    if (const auto it = entries_.find(g); it != entries_.end()) return it->second != nullptr;
    if (g.bf16 && !onednn_native_bf16()) {
      make_room(g);
      entries_.emplace(g, nullptr);
      return false;
    }
    onednn_set_threads(threads);
    try {
      create(g);  // makes room first
    } catch (const unavailable&) {
      entries_.emplace(g, nullptr);
      return false;
    }
    return true;
  }

  /// y = conv(x, w) + bias for g.n images: x NCHW (fp32, or bf16 encodings where g.src16), w
  /// OIHW, bias f values, y NCHW (n x f x oh x ow); `threads` is the context's thread budget.
  /// g.n > 0 and available(g).
  void forward(int threads, const conv_geometry& g, const void* x, const float* w, const float* bias, float* y) {
    onednn_set_threads(threads);
    entry& e = find_or_create(g);
    load(e.src, x);
    load(e.weights, w);
    set(e.bias.get(), bias);
    std::array<dnnl_exec_arg_t, 5> args{{{DNNL_ARG_SRC, e.src.used()},
                                         {DNNL_ARG_WEIGHTS, e.weights.used()},
                                         {DNNL_ARG_BIAS, e.bias.get()},
                                         {DNNL_ARG_DST, e.dst.used()},
                                         {DNNL_ARG_SCRATCHPAD, nullptr}}};
    bind_output(e.dst, y);
    execute(e.fwd, args, "forward", g);
    store(e.dst);
  }

  /// The weight and bias gradients of the summed loss for g.n images, written (or, with
  /// `accumulate`, added) to dw (OIHW) and db (f values); and, when dx is not null, the input
  /// gradient dx (NCHW). x, w and dy as forward's x, w and output gradient. g.n > 0 and available(g).
  void backward(int threads, const conv_geometry& g, const void* x, const float* w, const float* dy, float* dw,
                float* db, bool accumulate, float* dx) {
    onednn_set_threads(threads);
    entry& e = find_or_create(g);
    if (!e.bwd_weights.primitive) create_backward_weights(e, g);
    load(e.src_w, x);
    load(e.diff_dst_w, dy);
    bind_output(e.diff_weights, e.grad.get());
    set(e.diff_bias.get(), e.grad.get() + weights_count(g));
    std::array<dnnl_exec_arg_t, 5> args{{{DNNL_ARG_SRC, e.src_w.used()},
                                         {DNNL_ARG_DIFF_DST, e.diff_dst_w.used()},
                                         {DNNL_ARG_DIFF_WEIGHTS, e.diff_weights.used()},
                                         {DNNL_ARG_DIFF_BIAS, e.diff_bias.get()},
                                         {DNNL_ARG_SCRATCHPAD, nullptr}}};
    execute(e.bwd_weights, args, "backward-weights", g);
    store(e.diff_weights);
    const std::size_t nw = weights_count(g);
    const float* grad = e.grad.get();
    if (accumulate) {
      for (std::size_t i = 0; i < nw; ++i) dw[i] += grad[i];
      for (std::size_t i = 0; i < g.f; ++i) db[i] += grad[nw + i];
    } else {
      for (std::size_t i = 0; i < nw; ++i) dw[i] = grad[i];
      for (std::size_t i = 0; i < g.f; ++i) db[i] = grad[nw + i];
    }
    if (!dx) return;
    if (!e.bwd_data.primitive) create_backward_data(e, g);
    if (!e.shared_diff_dst) load(e.diff_dst_d, dy);  // else backward-weights' copy of dy serves
    load(e.weights_d, w);
    bind_output(e.diff_src, dx);
    const dnnl_memory_t diff_dst = e.shared_diff_dst ? e.diff_dst_w.used() : e.diff_dst_d.used();
    std::array<dnnl_exec_arg_t, 4> data_args{{{DNNL_ARG_DIFF_DST, diff_dst},
                                              {DNNL_ARG_WEIGHTS, e.weights_d.used()},
                                              {DNNL_ARG_DIFF_SRC, e.diff_src.used()},
                                              {DNNL_ARG_SCRATCHPAD, nullptr}}};
    execute(e.bwd_data, data_args, "backward-data", g);
    store(e.diff_src);
  }

  /// Batch sizes kept per convolution (the same geometry but n): a training epoch's full and last
  /// batch, an evaluation's two, each with a micro-shard's remainder. Another one evicts the least recently used (its primitives and
  /// operand buffers, the size of a batch of activations each), so predict over ever-changing
  /// batch sizes keeps memory bounded.
  static constexpr std::size_t batch_sizes_kept = 8;

  /// Number of cached shapes that run here (see available).
  [[nodiscard]] std::size_t shapes() const noexcept {
    std::size_t n = 0;
    for (const auto& kv : entries_) n += kv.second != nullptr;
    return n;
  }
  /// Number of cached shapes, those that do not run here (markers, see available) included: at
  /// most batch_sizes_kept per convolution (the same geometry but n).
  [[nodiscard]] std::size_t entries() const noexcept { return entries_.size(); }
  /// The implementation oneDNN chose for the most recently created forward primitive (for example
  /// "jit:avx512_core"); empty before the first convolution.
  [[nodiscard]] const std::string& last_implementation() const noexcept { return last_impl_; }

private:
  // Thrown where oneDNN has no bf16 primitive for a shape (caught by available).
  struct unavailable {};

  struct aligned_free {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t{page}); }
  };
  using buffer = std::unique_ptr<std::byte[], aligned_free>;
  static constexpr std::size_t page = 4096;

  static buffer allocate(std::size_t bytes) {
    return buffer(new (std::align_val_t{page}) std::byte[(bytes + page - 1) / page * page]);
  }

  // A tensor that the caller holds in lockstep's plain layout and a primitive reads or writes in
  // its own: `user` points at the caller's buffer; where the layouts differ, `inner` owns a
  // buffer in the primitive's layout and `reorder` converts (user to inner for an input, inner
  // to user for an output).
  struct operand {
    onednn_ptr<dnnl_memory_t> user, inner;
    onednn_ptr<dnnl_primitive_t> reorder;
    buffer storage;
    // The memory object the primitive uses.
    [[nodiscard]] dnnl_memory_t used() const noexcept { return inner ? inner.get() : user.get(); }
  };
  // One primitive and its scratchpad's memory object.
  struct pass {
    onednn_ptr<dnnl_primitive_t> primitive;
    onednn_ptr<dnnl_memory_t> scratchpad;
  };
  struct entry {
    onednn_ptr<dnnl_primitive_desc_t> fwd_pd;  // the hint of the backward primitives
    pass fwd, bwd_data, bwd_weights;
    operand src, weights, dst;                   // forward
    onednn_ptr<dnnl_memory_t> bias;              // plain, f values
    operand src_w, diff_dst_w, diff_weights;     // backward-weights
    onednn_ptr<dnnl_memory_t> diff_bias;         // plain, f values
    operand diff_dst_d, weights_d, diff_src;     // backward-data
    bool shared_diff_dst = false;                // backward-data reads backward-weights' dy (same layout)
    std::unique_ptr<float[]> grad;               // the weight then bias gradients, OIHW then f
    std::uint64_t used = 0;                      // when it last ran (the cache's tick_)
  };
  struct geometry_hash {
    std::size_t operator()(const conv_geometry& g) const noexcept {
      std::uint64_t h = 1469598103934665603ull;
      for (const std::size_t v :
           {g.n, g.c, g.h, g.w, g.f, g.k, g.stride, g.pad, g.oh, g.ow, std::size_t{g.bf16}, std::size_t{g.src16}})
        h = (h ^ static_cast<std::uint64_t>(v)) * 1099511628211ull;
      return static_cast<std::size_t>(h);
    }
  };

  static std::size_t weights_count(const conv_geometry& g) noexcept { return g.f * g.c * g.k * g.k; }

  static std::string describe(const conv_geometry& g) {
    return "convolution of " + std::to_string(g.n) + " images " + std::to_string(g.c) + "x" + std::to_string(g.h) +
           "x" + std::to_string(g.w) + ", " + std::to_string(g.f) + " filters " + std::to_string(g.k) + "x" +
           std::to_string(g.k) + ", stride " + std::to_string(g.stride) + ", padding " + std::to_string(g.pad) +
           (g.bf16 ? ", bf16 operands" : "") + (g.src16 ? ", images given in bf16" : "");
  }

  static void set(dnnl_memory_t m, const void* p) {
    // oneDNN only reads the sources; its memory objects hold non-const pointers.
    onednn_check(dnnl_memory_set_data_handle(m, const_cast<void*>(p)), "dnnl_memory_set_data_handle");
  }

  void run_reorder(dnnl_primitive_t reorder, dnnl_memory_t from, dnnl_memory_t to) {
    const std::array<dnnl_exec_arg_t, 2> args{{{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}};
    onednn_check(dnnl_primitive_execute(reorder, on_.stream.get(), 2, args.data()), "dnnl_primitive_execute", "reorder");
  }

  // Points an input operand at the caller's data and converts it to the primitive's layout.
  void load(operand& o, const void* data) {
    set(o.user.get(), data);
    if (o.reorder) run_reorder(o.reorder.get(), o.user.get(), o.inner.get());
  }
  // Points an output operand at the caller's buffer (written by store).
  static void bind_output(operand& o, float* data) { set(o.user.get(), data); }
  // Converts an output operand from the primitive's layout to the caller's.
  void store(operand& o) {
    if (o.reorder) run_reorder(o.reorder.get(), o.inner.get(), o.user.get());
    onednn_check(dnnl_stream_wait(on_.stream.get()), "dnnl_stream_wait");
  }

  template <std::size_t N>
  void execute(pass& p, std::array<dnnl_exec_arg_t, N>& args, const char* which, const conv_geometry& g) {
    int nargs = static_cast<int>(N) - 1;
    if (p.scratchpad) {
      set(p.scratchpad.get(), scratchpad_.get());
      args[N - 1] = {DNNL_ARG_SCRATCHPAD, p.scratchpad.get()};
      nargs = static_cast<int>(N);
    }
    const dnnl_status_t status = dnnl_primitive_execute(p.primitive.get(), on_.stream.get(), nargs, args.data());
    if (status != dnnl_success) onednn_check(status, "dnnl_primitive_execute", std::string(which) + " " + describe(g));
  }

  onednn_ptr<dnnl_memory_t> memory(const dnnl_memory_desc_t* md, const std::string& what, void* handle) {
    dnnl_memory_t raw = nullptr;
    onednn_check(dnnl_memory_create(&raw, md, on_.engine.get(), handle), "dnnl_memory_create", what);
    return onednn_ptr<dnnl_memory_t>(raw);
  }

  // Sets up operand o between the caller's layout `user_md` and the layout `pd` chose for `query`.
  void bind(operand& o, const dnnl_memory_desc_t* user_md, const_dnnl_primitive_desc_t pd, dnnl_query_t query,
            bool input, const std::string& what) {
    const dnnl_memory_desc_t* inner_md = dnnl_primitive_desc_query_md(pd, query, 0);
    if (inner_md == nullptr) throw device_error("lockstep: oneDNN gave no memory layout for an operand of the " + what);
    o.user = memory(user_md, what, DNNL_MEMORY_NONE);
    if (dnnl_memory_desc_equal(user_md, inner_md)) return;
    o.storage = allocate(dnnl_memory_desc_get_size(inner_md));
    o.inner = memory(inner_md, what, o.storage.get());
    dnnl_primitive_desc_t raw_pd = nullptr;
    onednn_check(dnnl_reorder_primitive_desc_create(&raw_pd, input ? user_md : inner_md, on_.engine.get(),
                                                    input ? inner_md : user_md, on_.engine.get(), nullptr),
                 "dnnl_reorder_primitive_desc_create", what);
    const onednn_ptr<dnnl_primitive_desc_t> reorder_pd(raw_pd);
    dnnl_primitive_t raw = nullptr;
    onednn_check(dnnl_primitive_create(&raw, reorder_pd.get()), "dnnl_primitive_create", what);
    o.reorder.reset(raw);
  }

  // The primitive of `pd` in p, with its scratchpad (the shared buffer grown to what it needs).
  void finish(pass& p, const_dnnl_primitive_desc_t pd, const std::string& what) {
    dnnl_primitive_t raw = nullptr;
    onednn_check(dnnl_primitive_create(&raw, pd), "dnnl_primitive_create", what);
    p.primitive.reset(raw);
    const dnnl_memory_desc_t* scratch_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    const std::size_t bytes = scratch_md ? dnnl_memory_desc_get_size(scratch_md) : 0;
    if (bytes == 0) return;
    if (bytes > scratchpad_size_) {
      scratchpad_ = allocate(bytes);
      scratchpad_size_ = bytes;
    }
    p.scratchpad = memory(scratch_md, what, DNNL_MEMORY_NONE);
  }

  // Plain layouts: images NCHW, filters OIHW, biases one dimension, all fp32; `any` lets oneDNN
  // choose, with the operands the primitives read (src, weights, the output gradient dst_in) in
  // bf16 for a bf16 shape, and what they write (dst, diff_src in src32, diff_weights in
  // weights32) in fp32. src_in: the caller's images as the primitives read them (plain: NCHW in
  // bf16 where g.src16).
  struct layouts {
    dnnl_memory_desc_t src, weights, bias, dst, dst_in, src32, weights32, src_in;
    layouts(const conv_geometry& g, bool any, const std::string& what) {
      const auto d = [](std::size_t v) { return static_cast<dnnl_dim_t>(v); };
      const dnnl_dims_t src_dims{d(g.n), d(g.c), d(g.h), d(g.w)}, weights_dims{d(g.f), d(g.c), d(g.k), d(g.k)};
      const dnnl_dims_t bias_dims{d(g.f)}, dst_dims{d(g.n), d(g.f), d(g.oh), d(g.ow)};
      const dnnl_data_type_t in = any && g.bf16 ? dnnl_bf16 : dnnl_f32;
      const auto init = [&](dnnl_memory_desc_t& md, int nd, const dnnl_dims_t dims, dnnl_data_type_t type,
                            dnnl_format_tag_t plain) {
        onednn_check(dnnl_memory_desc_init_by_tag(&md, nd, dims, type, any ? dnnl_format_tag_any : plain),
                     "dnnl_memory_desc_init_by_tag", what);
      };
      init(src, 4, src_dims, in, dnnl_nchw);
      init(weights, 4, weights_dims, in, dnnl_oihw);
      init(dst, 4, dst_dims, dnnl_f32, dnnl_nchw);
      init(dst_in, 4, dst_dims, in, dnnl_nchw);
      init(src32, 4, src_dims, dnnl_f32, dnnl_nchw);
      init(src_in, 4, src_dims, any ? in : (g.src16 ? dnnl_bf16 : dnnl_f32), dnnl_nchw);
      init(weights32, 4, weights_dims, dnnl_f32, dnnl_oihw);
      onednn_check(dnnl_memory_desc_init_by_tag(&bias, 1, bias_dims, dnnl_f32, dnnl_a), "dnnl_memory_desc_init_by_tag",
                   what);
    }
  };

  static onednn_ptr<dnnl_primitive_attr_t> user_scratchpad() {
    dnnl_primitive_attr_t raw = nullptr;
    onednn_check(dnnl_primitive_attr_create(&raw), "dnnl_primitive_attr_create");
    onednn_ptr<dnnl_primitive_attr_t> attr(raw);
    onednn_check(dnnl_primitive_attr_set_scratchpad_mode(attr.get(), dnnl_scratchpad_mode_user),
                 "dnnl_primitive_attr_set_scratchpad_mode");
    return attr;
  }

  // The primitive descriptor of desc; for a bf16 shape, `unavailable` where oneDNN has none, or
  // only its reference implementation (correct but far slower than lockstep's own path).
  onednn_ptr<dnnl_primitive_desc_t> make_pd(const dnnl_convolution_desc_t& desc, const_dnnl_primitive_desc_t hint,
                                            const conv_geometry& g, const std::string& what) {
    const auto attr = user_scratchpad();
    dnnl_primitive_desc_t raw = nullptr;
    const dnnl_status_t status = dnnl_primitive_desc_create(&raw, &desc, attr.get(), on_.engine.get(), hint);
    if (status == dnnl_unimplemented && g.bf16) throw unavailable{};
    onednn_check(status, "dnnl_primitive_desc_create", what);
    onednn_ptr<dnnl_primitive_desc_t> pd(raw);
    const char* impl = nullptr;
    if (g.bf16 && dnnl_primitive_desc_query(raw, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
        std::string_view(impl).starts_with("ref"))
      throw unavailable{};
    return pd;
  }

  static void window(const conv_geometry& g, dnnl_dims_t strides, dnnl_dims_t pad_l, dnnl_dims_t pad_r) {
    strides[0] = strides[1] = static_cast<dnnl_dim_t>(g.stride);
    pad_l[0] = pad_l[1] = pad_r[0] = pad_r[1] = static_cast<dnnl_dim_t>(g.pad);
  }

  entry& find_or_create(const conv_geometry& g) {
    if (const auto it = entries_.find(g); it != entries_.end() && it->second) {
      it->second->used = ++tick_;
      return *it->second;
    }
    return create(g);
  }

  // Before g's entry (or marker of a shape that does not run here) is made: when batch_sizes_kept
  // entries hold g's convolution at other batch sizes, drops one of them: a marker if there is one
  // (nothing to free but a map node; markers count, so they stay bounded too), else the least
  // recently used entry.
  void make_room(const conv_geometry& g) {
    std::size_t same = 0;
    auto oldest = entries_.end(), marker = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      conv_geometry other = it->first;
      other.n = g.n;
      if (!(other == g)) continue;
      ++same;
      if (!it->second)
        marker = it;
      else if (oldest == entries_.end() || it->second->used < oldest->second->used)
        oldest = it;
    }
    if (same >= batch_sizes_kept) entries_.erase(marker != entries_.end() ? marker : oldest);
  }

  // Creates the entry of g: the forward primitive, and for a bf16 shape the backward ones too (so
  // that available() knows all three exist). Inserted only once complete.
  entry& create(const conv_geometry& g) {
    make_room(g);  // before this one's buffers exist
    const std::string what = describe(g);
    const layouts plain(g, false, what), any(g, true, what);
    dnnl_dims_t strides{}, pad_l{}, pad_r{};
    window(g, strides, pad_l, pad_r);
    dnnl_convolution_desc_t desc{};
    onednn_check(dnnl_convolution_forward_desc_init(&desc, dnnl_forward_training, dnnl_convolution_direct, &any.src,
                                                    &any.weights, &plain.bias, &any.dst, strides, pad_l, pad_r),
                 "dnnl_convolution_forward_desc_init", what);
    auto e = std::make_unique<entry>();
    e->fwd_pd = make_pd(desc, nullptr, g, what);
    const_dnnl_primitive_desc_t pd = e->fwd_pd.get();
    bind(e->src, &plain.src_in, pd, dnnl_query_src_md, true, what);
    bind(e->weights, &plain.weights, pd, dnnl_query_weights_md, true, what);
    bind(e->dst, &plain.dst, pd, dnnl_query_dst_md, false, what);
    e->bias = memory(&plain.bias, what, DNNL_MEMORY_NONE);
    finish(e->fwd, pd, what);
    if (g.bf16) {
      create_backward_weights(*e, g);
      create_backward_data(*e, g);
    }
    const char* impl = nullptr;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl) last_impl_ = impl;
    entry& result = *e;
    result.used = ++tick_;
    entries_.insert_or_assign(g, std::move(e));
    return result;
  }

  void create_backward_weights(entry& e, const conv_geometry& g) {
    const std::string what = "backward-weights " + describe(g);
    const layouts plain(g, false, what), any(g, true, what);
    dnnl_dims_t strides{}, pad_l{}, pad_r{};
    window(g, strides, pad_l, pad_r);
    dnnl_convolution_desc_t desc{};
    onednn_check(dnnl_convolution_backward_weights_desc_init(&desc, dnnl_convolution_direct, &any.src, &any.weights32,
                                                             &plain.bias, &any.dst_in, strides, pad_l, pad_r),
                 "dnnl_convolution_backward_weights_desc_init", what);
    const auto pd = make_pd(desc, e.fwd_pd.get(), g, what);
    bind(e.src_w, &plain.src_in, pd.get(), dnnl_query_src_md, true, what);
    bind(e.diff_dst_w, &plain.dst, pd.get(), dnnl_query_diff_dst_md, true, what);
    bind(e.diff_weights, &plain.weights, pd.get(), dnnl_query_diff_weights_md, false, what);
    e.diff_bias = memory(&plain.bias, what, DNNL_MEMORY_NONE);
    e.grad = std::make_unique<float[]>(weights_count(g) + g.f);
    finish(e.bwd_weights, pd.get(), what);
  }

  void create_backward_data(entry& e, const conv_geometry& g) {
    const std::string what = "backward-data " + describe(g);
    const layouts plain(g, false, what), any(g, true, what);
    dnnl_dims_t strides{}, pad_l{}, pad_r{};
    window(g, strides, pad_l, pad_r);
    dnnl_convolution_desc_t desc{};
    onednn_check(dnnl_convolution_backward_data_desc_init(&desc, dnnl_convolution_direct, &any.src32, &any.weights,
                                                          &any.dst_in, strides, pad_l, pad_r),
                 "dnnl_convolution_backward_data_desc_init", what);
    const auto pd = make_pd(desc, e.fwd_pd.get(), g, what);
    // Backward-weights (created first) already converts dy; where backward-data wants the same
    // layout, it reads that copy instead of converting dy again.
    const dnnl_memory_desc_t* weights_dy = nullptr;
    const dnnl_memory_desc_t* data_dy = dnnl_primitive_desc_query_md(pd.get(), dnnl_query_diff_dst_md, 0);
    if (e.diff_dst_w.user)
      onednn_check(dnnl_memory_get_memory_desc(e.diff_dst_w.used(), &weights_dy), "dnnl_memory_get_memory_desc", what);
    e.shared_diff_dst = weights_dy && data_dy && dnnl_memory_desc_equal(weights_dy, data_dy);
    if (!e.shared_diff_dst) bind(e.diff_dst_d, &plain.dst, pd.get(), dnnl_query_diff_dst_md, true, what);
    bind(e.weights_d, &plain.weights, pd.get(), dnnl_query_weights_md, true, what);
    bind(e.diff_src, &plain.src, pd.get(), dnnl_query_diff_src_md, false, what);
    finish(e.bwd_data, pd.get(), what);
  }

  // Declared first, destroyed last: the primitives and memory objects go before the engine.
  onednn_engine_stream on_;
  buffer scratchpad_;
  std::size_t scratchpad_size_ = 0;
  std::unordered_map<conv_geometry, std::unique_ptr<entry>, geometry_hash> entries_;
  std::uint64_t tick_ = 0;  // counts the entries' uses (least recently used: the smallest `used`)
  std::string last_impl_;
};

/// Where a host_context keeps its oneDNN convolution cache.
using onednn_conv_slot = onednn_slot<onednn_conv_cache>;

}  // namespace lockstep::backend::detail
