// polytile's CPU backend against the vendor peers, in the same run and on the same thread count:
// conv2d NHWC f32 forward, backward-data and backward-weights against oneDNN 2.6 (layouts left `any`;
// "onednn" times the primitive on its preferred layouts, "onednn_reorders" adds the reorders from and to
// NHWC), sgemm against OpenBLAS (on AVX-512 CPUs its kernels selected with OPENBLAS_CORETYPE=Cooperlake:
// OpenBLAS 0.3.21 misdetects Sapphire Rapids as Prescott), max pool and softmax forward/backward (GB/s; softmax also with
// its row maxima held constant in the gradient, bwd_stop_max, as the frameworks compute it), transpositions against
// oneDNN's reorder (GB/s), a transformer's GELU and layer norm against oneDNN and its attention (GFLOP/s;
// its peers PyTorch and JAX alone), compile time per stage
// (its peer, JAX compiling the same conv, is timed by framework_peers.py in the same run_bench.py --frameworks run), and the
// defracted backward-data kernel against the same gradient compiled without reduce/defract, the 1x1 forward
// and weight gradients and sgemm 2048 against themselves without the micro-kernels' prefetches ("no_prefetch"), and conv + bias
// + relu with the consumer fused into the conv against the same layer unfused, the bias gradient against
// itself without split reductions ("unsplit"), softmax against itself without row groups ("alone"), and
// softmax and the max pool gradient against themselves with every store through the caches ("cached").
// polytile's gradients come from its own autodiff. Every benchmark reports GFLOP/s (or GB/s);
// bench/run_bench.py pairs "<case>/polytile" with "<case>/<peer>" and prints the ratios.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <iostream>
#include <random>
#include <set>
#include <tuple>
#include <unordered_map>

#include "bench_threads.h"
#include "polytile/autodiff.h"
#include "polytile/cpu.h"
#include "polytile/parser.h"
#include "polytile/passes.h"

namespace {

using namespace polytile;
using dnnl::memory;

Buffer random_f32(std::vector<int64_t> shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Buffer b(DType::f32, std::move(shape));
  auto* p = static_cast<float*>(b.data());
  for (int64_t i = 0; i < b.size(); ++i) p[i] = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 - 0.5);
  return b;
}

std::map<std::string, TensorType> types_of(const TensorMap& in) {
  std::map<std::string, TensorType> t;
  for (const auto& [name, b] : in) t[name] = TensorType{b.dtype(), b.shape()};
  return t;
}

// $POLYTILE_BENCH_CPU names the CPU polytile's code is made for (cpu::cpu_target: "znver3" times AVX2
// code on an AVX-512 machine; set ONEDNN_MAX_CPU_ISA=AVX2 and OPENBLAS_CORETYPE=Zen to hold the peers to
// the same instructions); unset, this machine's.
cpu::CompileOptions options() {
  cpu::CompileOptions o;
  o.target = cpu::cpu_target(bench_cpu());
  o.threads = bench_threads();
  return o;
}

// ---------------------------------------------------------------------------------------------- convs

struct Conv {
  const char* name;
  int64_t n, h, w, ci, co, kh, kw, stride, dilation, pad;
  bool nchw = false;  // the layouts PyTorch defaults to: I[N, CI, H, W], K[CO, CI, KH, KW], O[N, CO, OH, OW]
  // Depthwise (ci == co, one group per channel: a MobileNet's 3x3 layers): K[C, KH, KW] with NCHW (PyTorch's
  // [C, 1, KH, KW]), K[KH, KW, C] with NHWC (TensorFlow's [KH, KW, 1, C]).
  bool depthwise = false;
  int64_t oh() const { return (h + 2 * pad - dilation * (kh - 1) - 1) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - dilation * (kw - 1) - 1) / stride + 1; }
  double flops() const { return 2.0 * n * oh() * ow() * co * (depthwise ? 1 : ci) * kh * kw; }
  std::vector<int64_t> input_shape() const { return nchw ? std::vector<int64_t>{n, ci, h, w} : std::vector<int64_t>{n, h, w, ci}; }
  std::vector<int64_t> weight_shape() const {
    if (depthwise) return nchw ? std::vector<int64_t>{co, kh, kw} : std::vector<int64_t>{kh, kw, co};
    return nchw ? std::vector<int64_t>{co, ci, kh, kw} : std::vector<int64_t>{kh, kw, ci, co};
  }
  std::vector<int64_t> output_shape() const { return nchw ? std::vector<int64_t>{n, co, oh(), ow()} : std::vector<int64_t>{n, oh(), ow(), co}; }
  std::string tile() const {
    auto s = [](int64_t v) { return std::to_string(v); };
    std::string pad_text = pad ? " - " + s(pad) : "";
    const std::string y = s(stride) + "*y + " + s(dilation) + "*j" + pad_text, x = s(stride) + "*x + " + s(dilation) + "*i" + pad_text;
    if (depthwise && nchw)
      return "function (I[N, C, H, W], K[C, KH, KW]) -> (O) {\n  O[n, c, y, x : N, C, " + s(oh()) + ", " + s(ow()) + "] = +(I[n, c, " +
             y + ", " + x + "] * K[c, j, i]);\n}\n";
    if (depthwise)
      return "function (I[N, H, W, C], K[KH, KW, C]) -> (O) {\n  O[n, y, x, c : N, " + s(oh()) + ", " + s(ow()) + ", C] = +(I[n, " +
             y + ", " + x + ", c] * K[j, i, c]);\n}\n";
    if (nchw)
      return "function (I[N, CI, H, W], K[CO, CI, KH, KW]) -> (O) {\n  O[n, co, y, x : N, CO, " + s(oh()) + ", " + s(ow()) +
             "] = +(I[n, ci, " + s(stride) + "*y + " + s(dilation) + "*j" + pad_text + ", " + s(stride) + "*x + " +
             s(dilation) + "*i" + pad_text + "] * K[co, ci, j, i]);\n}\n";
    return "function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {\n  O[n, y, x, co : N, " + s(oh()) + ", " + s(ow()) +
           ", CO] = +(I[n, " + s(stride) + "*y + " + s(dilation) + "*j" + pad_text + ", " + s(stride) + "*x + " +
           s(dilation) + "*i" + pad_text + ", ci] * K[j, i, ci, co]);\n}\n";
  }
};

const Conv kConvs[] = {
    {"conv3x3_64_56", 8, 56, 56, 64, 64, 3, 3, 1, 1, 1},   {"conv3x3_128_28", 8, 28, 28, 128, 128, 3, 3, 1, 1, 1},
    {"conv3x3_256_14", 8, 14, 14, 256, 256, 3, 3, 1, 1, 1}, {"conv1x1_256to64_56", 8, 56, 56, 256, 64, 1, 1, 1, 1, 0},
    {"conv3x3_s2_64_56", 8, 56, 56, 64, 64, 3, 3, 2, 1, 1}, {"conv2x2_s3_d2_seed", 8, 57, 57, 64, 64, 2, 2, 3, 2, 0},
    {"conv3x3_96_28", 8, 28, 28, 96, 96, 3, 3, 1, 1, 1},  // channels that 64-lane columns do not divide
    {"dwconv3x3_64_56", 8, 56, 56, 64, 64, 3, 3, 1, 1, 1, false, true},  // depthwise: memory-bound
};

enum class Direction { forward, backward_data, backward_weights };
const char* direction_name(Direction d) {
  return d == Direction::forward ? "fwd" : d == Direction::backward_data ? "bwd_data" : "bwd_weights";
}

// polytile: forward as written; the gradients through autodiff (vjp w.r.t. one input), reduced and
// defracted when the options are.
void BM_PolytileConv(benchmark::State& state, Conv c, Direction d, cpu::CompileOptions o) {
  Program fwd = parse_program(c.tile());
  TensorMap in{{"I", random_f32(c.input_shape(), 1)}, {"K", random_f32(c.weight_shape(), 2)}};
  Program p = fwd;
  if (d != Direction::forward) {
    ad::Options ao;
    ao.wrt = {d == Direction::backward_data ? "I" : "K"};
    ao.reduce_and_defract = o.reduce_and_defract;
    p = ad::vjp(fwd, ao).program;
    in["DO"] = random_f32(c.output_shape(), 3);
  }
  auto compiled = cpu::compile(p, types_of(in), o);
  TensorMap out;  // outputs stay allocated across iterations, as the peers' destinations do
  compiled->run(in, out);  // warm-up: the outputs and scratch tensors are allocated (and faulted in) once
  for (auto _ : state) {
    compiled->run(in, out);
    benchmark::DoNotOptimize(out);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(c.flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Epilogue fusion: conv + bias + relu with the consumer fused into the conv's micro-kernel, against the
// same layer with the conv's output also requested (so it is materialized and the consumer runs as its
// own nest).
void BM_PolytileConvBiasRelu(benchmark::State& state, Conv c, bool fused) {
  std::string text = c.tile();
  text.replace(text.find("-> (O)"), 6, fused ? "-> (R)" : "-> (O, R)");
  text.replace(text.find("K[KH, KW, CI, CO])"), 18, "K[KH, KW, CI, CO], Bias[CO])");
  text.insert(text.rfind('}'), "  R = relu(O + Bias);\n");
  Program p = parse_program(text);
  TensorMap in{{"I", random_f32({c.n, c.h, c.w, c.ci}, 1)}, {"K", random_f32({c.kh, c.kw, c.ci, c.co}, 2)},
               {"Bias", random_f32({c.co}, 4)}};
  auto compiled = cpu::compile(p, types_of(in), options());
  TensorMap out;
  compiled->run(in, out);  // warm-up, as above
  for (auto _ : state) {
    compiled->run(in, out);
    benchmark::DoNotOptimize(out);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(c.flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// oneDNN memory of `md` on storage the bench allocates as polytile allocates its buffers (Buffer: from 2 MiB
// on, 2 MiB-aligned and advised for transparent huge pages), kept in `keep`, so that both libraries stream
// through the same kind of pages (a row sum of 64 MiB ran 1.2-1.5x faster on huge pages on a Zen 4 guest).
memory on_buffer(const memory::desc& md, const dnnl::engine& eng, std::vector<Buffer>& keep) {
  keep.emplace_back(DType::f32, std::vector<int64_t>{static_cast<int64_t>((md.get_size() + 3) / 4)});
  return memory(md, eng, keep.back().data());
}

struct OneDnnConv {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::vector<Buffer> storage;  // the memories' (on_buffer)
  dnnl::stream s{eng};
  memory::dims src, wei, dst, strides, dil, pad_l, pad_r;
  explicit OneDnnConv(const Conv& c)
      : src{c.n, c.ci, c.h, c.w}, wei{c.depthwise ? memory::dims{c.co, 1, 1, c.kh, c.kw} : memory::dims{c.co, c.ci, c.kh, c.kw}},
        dst{c.n, c.co, c.oh(), c.ow()}, strides{c.stride, c.stride},
        dil{c.dilation - 1, c.dilation - 1}, pad_l{c.pad, c.pad} {
    // Right padding so that the output size matches the formula above.
    int64_t rh = (c.oh() - 1) * c.stride + c.dilation * (c.kh - 1) + 1 - c.h - c.pad;
    int64_t rw = (c.ow() - 1) * c.stride + c.dilation * (c.kw - 1) + 1 - c.w - c.pad;
    pad_r = {std::max<int64_t>(rh, 0), std::max<int64_t>(rw, 0)};
  }
  memory::desc any(const memory::dims& d) { return memory::desc(d, memory::data_type::f32, memory::format_tag::any); }
  memory user(const memory::dims& d, memory::format_tag tag) {
    memory m = on_buffer({d, memory::data_type::f32, tag}, eng, storage);
    auto* p = static_cast<float*>(m.get_data_handle());
    size_t n = m.get_desc().get_size() / sizeof(float);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>((i % 13) * 0.01 - 0.06);
    return m;
  }
  using Reorders = std::vector<std::pair<dnnl::reorder, std::pair<memory, memory>>>;
  // The primitive's memory for a user input, with the reorder into it (when the layouts differ).
  memory prepare(memory& user_mem, const memory::desc& want, Reorders& reorders) {
    if (user_mem.get_desc() == want) return user_mem;
    memory m = on_buffer(want, eng, storage);
    reorders.push_back({dnnl::reorder(user_mem, m), {user_mem, m}});
    return m;
  }
  // The primitive's memory for a result, with the reorder back to the user's layout.
  memory result(memory& user_mem, const memory::desc& have, Reorders& reorders) {
    if (user_mem.get_desc() == have) return user_mem;
    memory m = on_buffer(have, eng, storage);
    reorders.push_back({dnnl::reorder(m, user_mem), {m, user_mem}});
    return m;
  }
};

void BM_OneDnnConv(benchmark::State& state, Conv c, Direction d, bool with_reorders) {
  OneDnnConv o(c);
  using namespace dnnl;
  auto fwd_desc = convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, o.any(o.src),
                                            o.any(o.wei), o.any(o.dst), o.strides, o.dil, o.pad_l, o.pad_r);
  auto fwd_pd = convolution_forward::primitive_desc(fwd_desc, o.eng);
  const auto activations = c.nchw ? memory::format_tag::nchw : memory::format_tag::nhwc;
  // Depthwise weights as groups of one channel: goihw holds PyTorch's [C, 1, KH, KW], hwigo [KH, KW, 1, C].
  const auto weights = c.depthwise ? (c.nchw ? memory::format_tag::goihw : memory::format_tag::hwigo)
                                   : (c.nchw ? memory::format_tag::oihw : memory::format_tag::hwio);
  memory user_src = o.user(o.src, activations), user_wei = o.user(o.wei, weights),
         user_dst = o.user(o.dst, activations);
  OneDnnConv::Reorders in_reorders, out_reorders;
  primitive prim;
  std::unordered_map<int, memory> args;
  if (d == Direction::forward) {
    memory src = o.prepare(user_src, fwd_pd.src_desc(), in_reorders), wei = o.prepare(user_wei, fwd_pd.weights_desc(), in_reorders);
    memory dst = o.result(user_dst, fwd_pd.dst_desc(), out_reorders);
    prim = convolution_forward(fwd_pd);
    args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}};
  } else if (d == Direction::backward_data) {
    auto bd = convolution_backward_data::desc(algorithm::convolution_direct, o.any(o.src), o.any(o.wei), o.any(o.dst),
                                              o.strides, o.dil, o.pad_l, o.pad_r);
    auto pd = convolution_backward_data::primitive_desc(bd, o.eng, fwd_pd);
    memory ddst = o.prepare(user_dst, pd.diff_dst_desc(), in_reorders), wei = o.prepare(user_wei, pd.weights_desc(), in_reorders);
    memory dsrc = o.result(user_src, pd.diff_src_desc(), out_reorders);
    prim = convolution_backward_data(pd);
    args = {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, dsrc}};
  } else {
    auto bw = convolution_backward_weights::desc(algorithm::convolution_direct, o.any(o.src), o.any(o.wei), o.any(o.dst),
                                                 o.strides, o.dil, o.pad_l, o.pad_r);
    auto pd = convolution_backward_weights::primitive_desc(bw, o.eng, fwd_pd);
    memory src = o.prepare(user_src, pd.src_desc(), in_reorders), ddst = o.prepare(user_dst, pd.diff_dst_desc(), in_reorders);
    memory dwei = o.result(user_wei, pd.diff_weights_desc(), out_reorders);
    prim = convolution_backward_weights(pd);
    args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_DIFF_WEIGHTS, dwei}};
  }
  for (auto& [r, mems] : in_reorders) r.execute(o.s, mems.first, mems.second);
  o.s.wait();
  for (auto _ : state) {
    if (with_reorders)
      for (auto& [r, mems] : in_reorders) r.execute(o.s, mems.first, mems.second);
    prim.execute(o.s, args);
    if (with_reorders)
      for (auto& [r, mems] : out_reorders) r.execute(o.s, mems.first, mems.second);
    o.s.wait();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(c.flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------------------------------------- sgemm

// sgemm/N: C = A B; sgemm_tn/N: C = A^T B (the product of every matmul's gradient with respect to B).
void BM_PolytileSgemm(benchmark::State& state, bool transposed_a, cpu::CompileOptions o) {
  int64_t n = state.range(0);
  Program p = parse_program(transposed_a ? "function (A[K, M], B[K, N]) -> (C) { C[i, j : M, N] = +(A[k, i] * B[k, j]); }"
                                         : "function (A[M, K], B[K, N]) -> (C) { C[i, j : M, N] = +(A[i, k] * B[k, j]); }");
  TensorMap in{{"A", random_f32({n, n}, 1)}, {"B", random_f32({n, n}, 2)}};
  auto compiled = cpu::compile(p, types_of(in), o);
  TensorMap out;  // outputs stay allocated across iterations, as the peers' destinations do
  compiled->run(in, out);  // warm-up: the outputs and scratch tensors are allocated (and faulted in) once
  for (auto _ : state) {
    compiled->run(in, out);
    benchmark::DoNotOptimize(out);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_OpenBlasSgemm(benchmark::State& state, bool transposed_a) {
  int64_t n = state.range(0);
  openblas_set_num_threads(bench_threads());
  Buffer a = random_f32({n, n}, 1), b = random_f32({n, n}, 2), c(DType::f32, {n, n});
  for (auto _ : state)
    cblas_sgemm(CblasRowMajor, transposed_a ? CblasTrans : CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(n), static_cast<int>(n), 1.0f,
                static_cast<const float*>(a.data()), static_cast<int>(n), static_cast<const float*>(b.data()),
                static_cast<int>(n), 0.0f, static_cast<float*>(c.data()), static_cast<int>(n));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * n * n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// ---------------------------------------------------------------------------------------------- pooling, softmax

// The "unsplit", "alone" and "cached" peers: the same program without split reductions, without row
// groups, or with every store through the caches (no non-temporal stores, CpuModel::stream_stores).
enum class Variant { as_is, unsplit, alone, cached };

// `stop_gradient`: tensors the gradient treats as constants (ad::Options::stop_gradient); `prove_zero`:
// ad::Options::prove_zero_adjoints (false: every adjoint as the rules write it).
void BM_PolytileStopping(benchmark::State& state, const std::string& text, TensorMap in, bool gradient, double bytes,
                         Variant variant, std::set<std::string> stop_gradient, bool prove_zero = true, const char* unit = "GB/s") {
  Program p = parse_program(text);
  if (gradient) {
    ProgramTypes t = infer_types(p, types_of(in));
    ad::Options ao;
    ao.stop_gradient = std::move(stop_gradient);
    ao.prove_zero_adjoints = prove_zero;
    Program g = ad::vjp(p, ao).program;
    for (const auto& o : p.outputs) in["D" + o] = random_f32(t.tensors.at(o).shape, 9);
    p = g;
  }
  cpu::CompileOptions o = options();
  if (variant == Variant::unsplit) o.target.cpu.split_max_outputs = 0;
  if (variant == Variant::alone) o.target.cpu.row_groups = false;
  if (variant == Variant::cached) o.target.cpu.stream_stores = false;
  auto compiled = cpu::compile(p, types_of(in), o);
  TensorMap out;  // outputs stay allocated across iterations, as the peers' destinations do
  compiled->run(in, out);  // warm-up: the outputs and scratch tensors are allocated (and faulted in) once
  for (auto _ : state) {
    compiled->run(in, out);
    benchmark::DoNotOptimize(out);
  }
  state.counters[unit] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Polytile(benchmark::State& state, const std::string& text, TensorMap in, bool gradient, double bytes, Variant variant) {
  BM_PolytileStopping(state, text, std::move(in), gradient, bytes, variant, {});
}

// A transformer's attention, softmax(Q K^T / 8) V over 16 heads of 512 tokens x 64, forward and the gradient of
// Q, K and V (the gradient program computes S and the softmax again; PyTorch's and JAX's steps, in
// framework_peers.py, run their forward too). GFLOP/s of the products, 2 B L^2 D each: 2 forward, 6 for the
// step with its gradient (2 forward, 4 backward). oneDNN 2.6 has no attention primitive.
const char* kAttention =
    "function (Q[B, L, D], K[B, L, D], V[B, L, D]) -> (O) {\n  S[b, i, j : B, L, L] = +(Q[b, i, d] * K[b, j, d]);\n  T = S * 0.125;\n"
    "  M[b, i, 0 : B, L, 1] = >(T[b, i, j]);\n  E = exp(T - M);\n  Z[b, i, 0 : B, L, 1] = +(E[b, i, j]);\n  P = E / Z;\n"
    "  O[b, i, d : B, L, D] = +(P[b, i, j] * V[b, j, d]);\n}\n";
constexpr int64_t kHeads = 16, kTokens = 512, kHeadDim = 64;

void BM_PolytileAttention(benchmark::State& state, bool gradient) {
  TensorMap in;
  uint64_t seed = 13;
  for (const char* t : {"Q", "K", "V"}) in[t] = random_f32({kHeads, kTokens, kHeadDim}, seed++);
  const double flops = (gradient ? 6 : 2) * 2.0 * kHeads * kTokens * kTokens * kHeadDim;
  BM_PolytileStopping(state, kAttention, std::move(in), gradient, flops, Variant::as_is, {}, true, "GFLOP/s");
}

const char* kMaxPool =
    "function (I[N, H, W, C]) -> (O) {\n"
    "  O[n, y, x, c : N, H/2, W/2, C] = >(I[n, 2*y + j, 2*x + i, c]), j < 2, i < 2;\n}\n";
// A bias gradient: the sum over batch and space of each channel (a reduction over the non-contiguous axes).
const char* kBiasGradient = "function (D[N, H, W, C]) -> (B) {\n  B[c : C] = +(D[n, y, x, c]);\n}\n";
// A global average pool (a ResNet-50's head: 2048 channels of 7 x 7, 64 images) in NCHW and in NHWC: the
// mean of each image's channel plane, 49 contiguous floats in NCHW, 49 floats 8 KiB apart in NHWC.
const char* kGlobalPoolNchw = "function (X[N, C, H, W]) -> (G) {\n  S[n, c : N, C] = +(X[n, c, y, x]);\n  G = S / 49.0;\n}\n";
const char* kGlobalPoolNhwc = "function (X[N, H, W, C]) -> (G) {\n  S[n, c : N, C] = +(X[n, y, x, c]);\n  G = S / 49.0;\n}\n";
// A normalization's scale gradient: each channel's sum over batch and space of the output gradient times
// the normalized input (a product's reduction over the non-contiguous axes; both tensors read once).
const char* kScaleGradient = "function (D[N, H, W, C], X[N, H, W, C]) -> (G) {\n  G[c : C] = +(D[n, y, x, c] * X[n, y, x, c]);\n}\n";
const char* kSoftmax =
    "function (X[N, C]) -> (O) {\n  M[i, 0 : N, 1] = >(X[i, j]);\n  E = exp(X - M);\n"
    "  S[i, 0 : N, 1] = +(E[i, j]);\n  O = E / S;\n}\n";

// A transposition, 2-d (a matrix) and 4-d (NHWC to NCHW), against oneDNN's reorder between the same two
// layouts (plain ab -> ba, acdb -> abcd: the same elements moved the same way).
const char* kTranspose2d = "function (I[M, N]) -> (O) {\n  O[i, j : N, M] = =(I[j, i]);\n}\n";
const char* kTransposeNhwc = "function (I[N, H, W, C]) -> (O) {\n  O[n, c, h, w : N, C, H, W] = =(I[n, h, w, c]);\n}\n";

// Fills oneDNN f32 memory `m` with the bench's random values.
void fill_random(const memory& m, uint64_t seed) {
  const size_t size = m.get_desc().get_size();
  Buffer values = random_f32({static_cast<int64_t>(size / 4)}, seed);
  std::memcpy(m.get_data_handle(), values.data(), size);
}

// Times oneDNN primitive `p` on `args`, the memories of `sources` filled with the bench's random values,
// after one warm-up run; `bytes` moved per run.
void time_onednn_args(benchmark::State& state, const dnnl::primitive& p, const std::unordered_map<int, memory>& args,
                      const std::vector<int>& sources, double bytes) {
  dnnl::stream s{args.begin()->second.get_engine()};
  uint64_t seed = 8;
  for (int arg : sources) fill_random(args.at(arg), seed++);
  p.execute(s, args);
  s.wait();
  for (auto _ : state) {
    p.execute(s, args);
    s.wait();
  }
  state.counters["GB/s"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Times oneDNN primitive `p` from `src` (filled with the bench's random values) to `dst`.
void time_onednn(benchmark::State& state, const dnnl::primitive& p, memory& src, memory& dst, double bytes) {
  time_onednn_args(state, p, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}}, {DNNL_ARG_SRC}, bytes);
}

void BM_OneDnnTranspose(benchmark::State& state, memory::dims dims, memory::format_tag from, memory::format_tag to) {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::vector<Buffer> storage;
  memory src = on_buffer({dims, memory::data_type::f32, from}, eng, storage), dst = on_buffer({dims, memory::data_type::f32, to}, eng, storage);
  int64_t elements = 1;
  for (auto d : dims) elements *= d;
  time_onednn(state, dnnl::reorder(src, dst), src, dst, 8.0 * static_cast<double>(elements));
}

// Reductions of a 64 MiB matrix (8192 x 2048 f32) along its rows (contiguous), its columns (strided: the
// output is the contiguous axis) and all of it, against oneDNN's reduction primitive to the same dst shape.
const char* kRowSum = "function (X[M, N]) -> (S) {\n  S[i : M] = +(X[i, j]);\n}\n";
const char* kColumnSum = "function (X[M, N]) -> (S) {\n  S[j : N] = +(X[i, j]);\n}\n";
const char* kColumnMax = "function (X[M, N]) -> (S) {\n  S[j : N] = >(X[i, j]);\n}\n";
const char* kTotal = "function (X[M, N]) -> (S) {\n  S[0 : 1] = +(X[i, j]);\n}\n";
constexpr int64_t kReduceRows = 8192, kReduceColumns = 2048;

// oneDNN's reduction of a src of `src_dims` to `dst_dims` (both in the layout `tag`), f32.
void BM_OneDnnReduction(benchmark::State& state, dnnl::algorithm algorithm, memory::dims src_dims, memory::dims dst_dims,
                        memory::format_tag tag) {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  memory::desc src_md(src_dims, memory::data_type::f32, tag);
  memory::desc dst_md(dst_dims, memory::data_type::f32, tag);
  dnnl::reduction::primitive_desc pd(dnnl::reduction::desc(algorithm, src_md, dst_md, 0.f, 0.f), eng);
  std::vector<Buffer> storage;
  memory src = on_buffer(src_md, eng, storage), dst = on_buffer(dst_md, eng, storage);
  time_onednn(state, dnnl::reduction(pd), src, dst, static_cast<double>(src_md.get_size()));
}

// A transformer's activation and normalization on 4096 and 8192 tokens of 1024 features: the GELU in its
// tanh form (GPT-2's, PyTorch's gelu(approximate='tanh')) and a layer norm without scale and shift (eps
// 1e-5), forward and backward; oneDNN's eltwise_gelu_tanh and layer_normalization in the same run (its
// backward reads the mean and variance its training forward stored; polytile's gradient program
// recomputes them from X).
const char* kGelu = "function (X[N, C]) -> (Y) {\n  Y = 0.5 * X * (1.0 + tanh(0.7978845608 * (X + 0.044715 * X * X * X)));\n}\n";
const char* kLayerNorm =
    "function (X[N, C]) -> (Y) {\n  S[n, 0 : N, 1] = +(X[n, c]);\n  D = X - S / 1024.0;\n"
    "  Q[n, 0 : N, 1] = +(D[n, c] * D[n, c]);\n  Y = D / sqrt(Q / 1024.0 + 0.00001);\n}\n";
constexpr int64_t kGeluRows = 4096, kNormRows = 8192, kFeatures = 1024;

void BM_OneDnnGelu(benchmark::State& state, bool backward) {
  using namespace dnnl;
  engine eng{engine::kind::cpu, 0};
  memory::desc md({kGeluRows, kFeatures}, memory::data_type::f32, memory::format_tag::ab);
  eltwise_forward::primitive_desc fwd(eltwise_forward::desc(prop_kind::forward_training, algorithm::eltwise_gelu_tanh, md, 0.f, 0.f), eng);
  std::vector<Buffer> storage;
  memory src = on_buffer(md, eng, storage), dst = on_buffer(md, eng, storage);
  const double bytes = static_cast<double>(md.get_size());
  if (!backward) {
    time_onednn(state, eltwise_forward(fwd), src, dst, 2 * bytes);
    return;
  }
  eltwise_backward::primitive_desc bwd(eltwise_backward::desc(algorithm::eltwise_gelu_tanh, md, md, 0.f, 0.f), eng, fwd);
  memory diff_dst = on_buffer(md, eng, storage), diff_src = on_buffer(md, eng, storage);
  time_onednn_args(state, eltwise_backward(bwd), {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src}},
                   {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST}, 3 * bytes);
}

void BM_OneDnnLayerNorm(benchmark::State& state, bool backward) {
  using namespace dnnl;
  engine eng{engine::kind::cpu, 0};
  memory::desc md({kNormRows, kFeatures}, memory::data_type::f32, memory::format_tag::ab);
  const float eps = 1e-5f;
  std::vector<Buffer> storage;
  memory src = on_buffer(md, eng, storage), dst = on_buffer(md, eng, storage);
  const double bytes = static_cast<double>(md.get_size());
  if (!backward) {
    layer_normalization_forward::primitive_desc fwd(
        layer_normalization_forward::desc(prop_kind::forward_inference, md, eps, normalization_flags::none), eng);
    time_onednn(state, layer_normalization_forward(fwd), src, dst, 2 * bytes);
    return;
  }
  layer_normalization_forward::primitive_desc fwd(
      layer_normalization_forward::desc(prop_kind::forward_training, md, eps, normalization_flags::none), eng);
  memory mean = on_buffer(fwd.mean_desc(), eng, storage), variance = on_buffer(fwd.variance_desc(), eng, storage);
  fill_random(src, 8);
  dnnl::stream s{eng};
  layer_normalization_forward(fwd).execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}, {DNNL_ARG_MEAN, mean}, {DNNL_ARG_VARIANCE, variance}});
  s.wait();
  layer_normalization_backward::primitive_desc bwd(
      layer_normalization_backward::desc(prop_kind::backward_data, md, md, eps, normalization_flags::none), eng, fwd);
  memory diff_dst = on_buffer(md, eng, storage), diff_src = on_buffer(md, eng, storage);
  time_onednn_args(state, layer_normalization_backward(bwd),
                   {{DNNL_ARG_SRC, src}, {DNNL_ARG_MEAN, mean}, {DNNL_ARG_VARIANCE, variance}, {DNNL_ARG_DIFF_DST, diff_dst},
                    {DNNL_ARG_DIFF_SRC, diff_src}},
                   {DNNL_ARG_DIFF_DST}, 3 * bytes);
}

// ---------------------------------------------------------------------------------------------- compile time

void BM_CompileConvForwardAndBackward(benchmark::State& state) {
  const Conv& c = kConvs[0];
  double parse = 0, autodiff = 0, passes = 0, schedule = 0, llvm_ir = 0, jit = 0;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    Program fwd = parse_program(c.tile());
    auto t1 = std::chrono::steady_clock::now();
    Program grad = ad::vjp(fwd, [] {
                     ad::Options o;
                     o.reduce_and_defract = false;
                     return o;
                   }()).program;
    auto t2 = std::chrono::steady_clock::now();
    parse += std::chrono::duration<double>(t1 - t0).count();
    autodiff += std::chrono::duration<double>(t2 - t1).count();
    std::map<std::string, TensorType> types{{"I", {DType::f32, {c.n, c.h, c.w, c.ci}}},
                                            {"K", {DType::f32, {c.kh, c.kw, c.ci, c.co}}},
                                            {"DO", {DType::f32, {c.n, c.oh(), c.ow(), c.co}}}};
    cpu::CompileOptions o = options();
    o.cache = false;  // really compile
    auto fwd_types = types;
    fwd_types.erase("DO");
    for (auto [p, t] : {std::make_pair(&fwd, &fwd_types), std::make_pair(&grad, &types)}) {
      auto compiled = cpu::compile(*p, *t, o);
      passes += compiled->times().passes;
      schedule += compiled->times().schedule;
      llvm_ir += compiled->times().llvm_ir;
      jit += compiled->times().optimize_and_jit;
    }
  }
  double n = static_cast<double>(state.iterations());
  state.counters["parse_ms"] = parse / n * 1e3;
  state.counters["autodiff_ms"] = autodiff / n * 1e3;
  state.counters["reduce_defract_ms"] = passes / n * 1e3;
  state.counters["schedule_ms"] = schedule / n * 1e3;
  state.counters["llvm_ir_ms"] = llvm_ir / n * 1e3;
  state.counters["optimize_jit_ms"] = jit / n * 1e3;
  // Compilations of the pair per second: run_bench.py pairs it with JAX's (framework_peers.py).
  state.counters["compiles/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  cpu::CompileOptions no_defract = options(), no_prefetch = options();
  no_defract.reduce_and_defract = false;
  no_prefetch.target.cpu.prefetch = false;
  for (const Conv& c : kConvs)
    for (Direction d : {Direction::forward, Direction::backward_data, Direction::backward_weights}) {
      std::string base = std::string("conv/") + c.name + "/" + direction_name(d);
      benchmark::RegisterBenchmark((base + "/polytile").c_str(), BM_PolytileConv, c, d, options())->Unit(benchmark::kMillisecond)->UseRealTime();
      benchmark::RegisterBenchmark((base + "/onednn").c_str(), BM_OneDnnConv, c, d, false)->Unit(benchmark::kMillisecond)->UseRealTime();
      benchmark::RegisterBenchmark((base + "/onednn_reorders").c_str(), BM_OneDnnConv, c, d, true)->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  // The first conv with PyTorch's default layouts (NCHW, OIHW) on both sides: polytile computes it in the
  // layout its micro-kernel wants and moves the output into place; oneDNN reorders into its blocked
  // layouts and back (onednn_reorders, the same work for a caller holding NCHW tensors). Also on images 32
  // columns wide, two vectors of 16 floats exactly (a CIFAR ResNet's layer): with padding, x's lanes follow
  // the reduction there; the stride-2 conv and a ResNet's stem (7x7, stride 2, 3 channels), whose input
  // no micro-kernel reads along x (2 * x + i - 3), and the depthwise conv (its micro-kernel's lanes along
  // x, masked at the borders per kernel position). Each of those four once ran as a nest of plain loops.
  for (Conv nchw : {kConvs[0], Conv{"conv3x3_64_32", 8, 32, 32, 64, 64, 3, 3, 1, 1, 1}, kConvs[4],
                    Conv{"conv7x7_s2_3to64_224", 8, 224, 224, 3, 64, 7, 7, 2, 1, 3}, kConvs[7]}) {
    nchw.nchw = true;
    for (Direction d : {Direction::forward, Direction::backward_data, Direction::backward_weights}) {
      if (nchw.ci == 3 && d == Direction::backward_data) continue;  // a stem's image needs no gradient
      std::string base = std::string("conv_nchw/") + nchw.name + "/" + direction_name(d);
      benchmark::RegisterBenchmark((base + "/polytile").c_str(), BM_PolytileConv, nchw, d, options())->Unit(benchmark::kMillisecond)->UseRealTime();
      benchmark::RegisterBenchmark((base + "/onednn_reorders").c_str(), BM_OneDnnConv, nchw, d, true)->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  }
  for (const Conv& c : {kConvs[5], kConvs[4]}) {
    std::string base = std::string("defract/") + c.name + "/bwd_data";
    benchmark::RegisterBenchmark((base + "/polytile").c_str(), BM_PolytileConv, c, Direction::backward_data, options())->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark((base + "/no_defract").c_str(), BM_PolytileConv, c, Direction::backward_data, no_defract)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  // With and without the micro-kernels' prefetches: of the next block's rows (the 1x1 forward), along
  // the broadcast operand's lines (the weight gradients) and of the vector operand's lines ahead (sgemm
  // 2048, whose reduction tiles are L2-sized).
  for (auto [c, d] : {std::pair{kConvs[3], Direction::forward}, std::pair{kConvs[3], Direction::backward_weights},
                      std::pair{kConvs[2], Direction::backward_weights}}) {
    std::string base = std::string("prefetch/") + c.name + "/" + direction_name(d);
    benchmark::RegisterBenchmark((base + "/polytile").c_str(), BM_PolytileConv, c, d, options())->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark((base + "/no_prefetch").c_str(), BM_PolytileConv, c, d, no_prefetch)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  benchmark::RegisterBenchmark("prefetch/sgemm/2048/polytile", BM_PolytileSgemm, false, options())->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::RegisterBenchmark("prefetch/sgemm/2048/no_prefetch", BM_PolytileSgemm, false, no_prefetch)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
  for (const Conv& c : {kConvs[0], kConvs[3]}) {
    std::string base = std::string("fusion/") + c.name + "/fwd_bias_relu";
    benchmark::RegisterBenchmark((base + "/polytile").c_str(), BM_PolytileConvBiasRelu, c, true)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark((base + "/unfused").c_str(), BM_PolytileConvBiasRelu, c, false)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  // 1000 and 2000: sizes that the micro-kernel's blocks (6 rows, 64 columns) do not divide.
  for (int64_t n : {256, 512, 1000, 1024, 2000, 2048}) {
    std::string base = "sgemm/" + std::to_string(n);
    benchmark::RegisterBenchmark((base + "/polytile").c_str(), BM_PolytileSgemm, false, options())->Arg(n)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark((base + "/openblas").c_str(), BM_OpenBlasSgemm, false)->Arg(n)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  for (int64_t n : {1024, 2048}) {
    std::string base = "sgemm_tn/" + std::to_string(n);
    benchmark::RegisterBenchmark((base + "/polytile").c_str(), BM_PolytileSgemm, true, options())->Arg(n)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark((base + "/openblas").c_str(), BM_OpenBlasSgemm, true)->Arg(n)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  // GB/s of the least memory a case moves: its inputs read once and its outputs written once. Max pool
  // forward: I and O (a quarter of I); backward: I and DO read, DI written (2.25 I). Softmax forward: X
  // and O; backward: X and DO read, DX written (1.5 times the forward's). Before 2026-11-29 both backward
  // cases counted twice their forward's bytes, a tenth and a third more than they move.
  TensorMap pool_in{{"I", random_f32({8, 112, 112, 64}, 5)}};
  const double pool_bytes = 4.0 * 8 * 112 * 112 * 64 * 1.25, pool_grad_bytes = 4.0 * 8 * 112 * 112 * 64 * 2.25;
  benchmark::RegisterBenchmark("maxpool/fwd/polytile", BM_Polytile, kMaxPool, pool_in, false, pool_bytes, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
  for (auto [peer, variant] : {std::pair{"polytile", Variant::as_is}, std::pair{"cached", Variant::cached}})
    benchmark::RegisterBenchmark((std::string("maxpool/bwd/") + peer).c_str(), BM_Polytile, kMaxPool, pool_in, true, pool_grad_bytes, variant)->Unit(benchmark::kMillisecond)->UseRealTime();
  TensorMap bias_in{{"D", random_f32({64, 28, 28, 32}, 7)}};
  const double bias_bytes = 4.0 * 64 * 28 * 28 * 32;
  benchmark::RegisterBenchmark("bias_grad/polytile", BM_Polytile, kBiasGradient, bias_in, false, bias_bytes, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::RegisterBenchmark("bias_grad/unsplit", BM_Polytile, kBiasGradient, bias_in, false, bias_bytes, Variant::unsplit)->Unit(benchmark::kMillisecond)->UseRealTime();
  TensorMap scale_in{{"D", random_f32({64, 28, 28, 32}, 7)}, {"X", random_f32({64, 28, 28, 32}, 9)}};
  benchmark::RegisterBenchmark("scale_grad/polytile", BM_Polytile, kScaleGradient, scale_in, false, 2 * bias_bytes, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
  const double pool_head_bytes = 4.0 * 64 * 2048 * 7 * 7;
  TensorMap head_nchw{{"X", random_f32({64, 2048, 7, 7}, 10)}}, head_nhwc{{"X", random_f32({64, 7, 7, 2048}, 10)}};
  benchmark::RegisterBenchmark("global_pool/nchw/polytile", BM_Polytile, kGlobalPoolNchw, head_nchw, false, pool_head_bytes, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::RegisterBenchmark("global_pool/nhwc/polytile", BM_Polytile, kGlobalPoolNhwc, head_nhwc, false, pool_head_bytes, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
  // oneDNN's mean over the plane, its dims N, C, H, W in either layout (abcd: NCHW, acdb: NHWC).
  for (auto [layout, tag] : {std::pair{"nchw", memory::format_tag::abcd}, std::pair{"nhwc", memory::format_tag::acdb}})
    benchmark::RegisterBenchmark((std::string("global_pool/") + layout + "/onednn").c_str(), BM_OneDnnReduction, dnnl::algorithm::reduction_mean,
                                 memory::dims{64, 2048, 7, 7}, memory::dims{64, 2048, 1, 1}, tag)->Unit(benchmark::kMillisecond)->UseRealTime();
  // GB/s: forward X read and Y written; backward X and DY read, DX written.
  TensorMap gelu_in{{"X", random_f32({kGeluRows, kFeatures}, 11)}}, norm_in{{"X", random_f32({kNormRows, kFeatures}, 12)}};
  const double gelu_bytes = 4.0 * kGeluRows * kFeatures, norm_bytes = 4.0 * kNormRows * kFeatures;
  for (bool backward : {false, true}) {
    const std::string direction = backward ? "bwd" : "fwd";
    const double moved = backward ? 3 : 2;
    benchmark::RegisterBenchmark(("gelu/" + direction + "/polytile").c_str(), BM_Polytile, kGelu, gelu_in, backward, moved * gelu_bytes, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("gelu/" + direction + "/onednn").c_str(), BM_OneDnnGelu, backward)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("layernorm/" + direction + "/polytile").c_str(), BM_Polytile, kLayerNorm, norm_in, backward, moved * norm_bytes, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("layernorm/" + direction + "/onednn").c_str(), BM_OneDnnLayerNorm, backward)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  for (bool backward : {false, true})
    benchmark::RegisterBenchmark((std::string("attention/") + (backward ? "bwd" : "fwd") + "/polytile").c_str(), BM_PolytileAttention, backward)
        ->Unit(benchmark::kMillisecond)->UseRealTime();
  TensorMap tr_in{{"I", random_f32({2048, 2048}, 8)}}, nhwc_in{{"I", random_f32({8, 56, 56, 64}, 8)}};
  benchmark::RegisterBenchmark("transpose/2048x2048/polytile", BM_Polytile, kTranspose2d, tr_in, false, 8.0 * 2048 * 2048, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::RegisterBenchmark("transpose/2048x2048/onednn", BM_OneDnnTranspose, memory::dims{2048, 2048}, memory::format_tag::ab, memory::format_tag::ba)->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::RegisterBenchmark("transpose/nhwc_to_nchw/polytile", BM_Polytile, kTransposeNhwc, nhwc_in, false, 8.0 * 8 * 56 * 56 * 64, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
  // oneDNN's dims are N, C, H, W whatever the layout: acdb is NHWC, abcd NCHW.
  benchmark::RegisterBenchmark("transpose/nhwc_to_nchw/onednn", BM_OneDnnTranspose, memory::dims{8, 64, 56, 56}, memory::format_tag::acdb, memory::format_tag::abcd)->Unit(benchmark::kMillisecond)->UseRealTime();
  TensorMap sm_in{{"X", random_f32({4096, 1000}, 6)}};
  const double sm_bytes = 4.0 * 4096 * 1000 * 2, sm_grad_bytes = 4.0 * 4096 * 1000 * 3;
  for (auto [peer, variant] : {std::pair{"polytile", Variant::as_is}, std::pair{"alone", Variant::alone}, std::pair{"cached", Variant::cached}}) {
    benchmark::RegisterBenchmark((std::string("softmax/fwd/") + peer).c_str(), BM_Polytile, kSoftmax, sm_in, false, sm_bytes, variant)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark((std::string("softmax/bwd/") + peer).c_str(), BM_Polytile, kSoftmax, sm_in, true, sm_grad_bytes, variant)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  // The gradient with the row maxima held constant, as jax.nn.softmax's custom JVP and PyTorch's softmax
  // backward compute it (the maxima's adjoint is zero in exact arithmetic: softmax does not change when a
  // row is shifted). Since 2026-12-01 autodiff proves that itself (ad::Options::prove_zero_adjoints), so
  // softmax/bwd above is the same program; softmax/bwd/through_max is the gradient as the rules write it,
  // through the maxima too (their adjoint computed as rounding noise and scattered to their arguments).
  benchmark::RegisterBenchmark("softmax/bwd_stop_max/polytile", BM_PolytileStopping, kSoftmax, sm_in, true, sm_grad_bytes,
                               Variant::as_is, std::set<std::string>{"M"}, true, "GB/s")->Unit(benchmark::kMillisecond)->UseRealTime();
  benchmark::RegisterBenchmark("softmax/bwd/through_max", BM_PolytileStopping, kSoftmax, sm_in, true, sm_grad_bytes,
                               Variant::as_is, std::set<std::string>{}, false, "GB/s")->Unit(benchmark::kMillisecond)->UseRealTime();
  TensorMap reduce_in{{"X", random_f32({kReduceRows, kReduceColumns}, 8)}};
  const double reduce_bytes = 4.0 * kReduceRows * kReduceColumns;
  for (auto [name, text, algorithm, dst] :
       {std::tuple{"rows", kRowSum, dnnl::algorithm::reduction_sum, memory::dims{kReduceRows, 1}},
        std::tuple{"columns", kColumnSum, dnnl::algorithm::reduction_sum, memory::dims{1, kReduceColumns}},
        std::tuple{"columns_max", kColumnMax, dnnl::algorithm::reduction_max, memory::dims{1, kReduceColumns}},
        std::tuple{"total", kTotal, dnnl::algorithm::reduction_sum, memory::dims{1, 1}}}) {
    const std::string base = std::string("reduce/") + name;
    benchmark::RegisterBenchmark((base + "/polytile").c_str(), BM_Polytile, text, reduce_in, false, reduce_bytes, Variant::as_is)->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark((base + "/onednn").c_str(), BM_OneDnnReduction, algorithm, memory::dims{kReduceRows, kReduceColumns}, dst,
                                 memory::format_tag::ab)->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  benchmark::RegisterBenchmark("compile/conv3x3_64_56/fwd+bwd/polytile", BM_CompileConvForwardAndBackward)
      ->Unit(benchmark::kMillisecond)
      ->Iterations(3)
      ->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  // OpenBLAS reads OPENBLAS_CORETYPE when it loads and misdetects AVX-512 Intel CPUs without it: re-run
  // ourselves with it set there, so the peer runs its AVX-512 kernels. Elsewhere its own detection stands
  // (a Zen 3 is "Zen"; forced to Cooperlake, OpenBLAS falls back to its Haswell kernels).
  __builtin_cpu_init();
  if (!std::getenv("OPENBLAS_CORETYPE") && __builtin_cpu_supports("avx512f")) {
    setenv("OPENBLAS_CORETYPE", "Cooperlake", 1);
    execv("/proc/self/exe", argv);
  }
  std::cerr << "OpenBLAS core type: " << openblas_get_corename() << ", threads: " << bench_threads()
            << ", polytile's code for CPU " << (*bench_cpu() ? bench_cpu() : "host") << "\n";
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
