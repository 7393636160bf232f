// src/cuda/attention.cu: the cuda backend's causal self-attention core (as llm.c) and its
// backward, in the cpu backend's arithmetic: scores and softmax sums in double, probabilities and
// outputs rounded once to the tensor's precision; the backward's dq, dk, dv each a sum in T of
// terms rounded as the cpu backend rounds them, in the same order (t ascending). One warp per
// (batch, head, time step); the softmax statistics are recomputed rather than stored (no limit on
// T). So the cpu bounds of docs/NUMERICS.md hold. Checked against the reference backend by
// tests/ops/test_attention.cpp (CudaMatchesRefWithinTheBound). And the attention of new positions
// over a key/value cache (attention_decode): one block per query row, float32, the softmax online
// over blocks of 128 keys (CudaDecodeMatchesRefWithinTheBound).
//   qkv [B, T, 3C] (q, k, v side by side, head h at h * hs), att [B, NH, T, T], out [B, T, C]
#include <cmath>

#include "cuda/common.cuh"

namespace fp8kit::cuda {

namespace {

constexpr int warps_per_block = 4;

struct Heads {
    int64_t b, t, c, nh, hs;
    double scale;  // 1 / sqrt(hs)
    // The row of q (which 0), k (1) or v (2) of head h at (batch bb, time tt).
    __device__ int64_t at(int64_t bb, int64_t tt, int which, int64_t h) const { return (bb * t + tt) * 3 * c + which * c + h * hs; }
};

Heads heads_of(const detail::AttentionJob& j) {
    const int64_t hs = j.c / j.nh;
    return {j.b, j.t, j.c, j.nh, hs, 1.0 / std::sqrt(double(hs))};
}

template <class T>
__device__ double dot(const T* a, const T* b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
    return s;
}

// The warp's (batch, head, time step): warp w of the grid is ((bb * nh + h) * t + t1).
struct Row {
    int64_t bb, h, t1;
    bool valid;
};
__device__ Row warp_row(const Heads& g) {
    const int64_t w = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / 32;
    return {w / (g.nh * g.t), w / g.t % g.nh, w % g.t, w < g.b * g.nh * g.t};
}

// att[bb, h, t1, :] = softmax over t2 <= t1 of scale q . k (0 above the diagonal);
// out[bb, t1, h] = sum_t2 att v (double, the rounded probabilities).
template <class T>
__global__ void attention_forward_kernel(detail::AttentionJob j, Heads g) {
    const Row r = warp_row(g);
    if (!r.valid) return;
    const int lane = threadIdx.x % 32;
    const T* qkv = static_cast<const T*>(j.qkv);
    const T* q = qkv + g.at(r.bb, r.t1, 0, r.h);
    double maxv = -INFINITY;
    for (int64_t t2 = lane; t2 <= r.t1; t2 += 32) maxv = Max{}(maxv, dot(q, qkv + g.at(r.bb, t2, 1, r.h), g.hs) * g.scale);
    maxv = warp_reduce(maxv, Max{});
    double sum = 0.0;
    for (int64_t t2 = lane; t2 <= r.t1; t2 += 32) sum += exp(dot(q, qkv + g.at(r.bb, t2, 1, r.h), g.hs) * g.scale - maxv);
    sum = warp_reduce(sum, Sum{});
    T* a = static_cast<T*>(j.att) + ((r.bb * g.nh + r.h) * g.t + r.t1) * g.t;
    for (int64_t t2 = lane; t2 < g.t; t2 += 32)
        a[t2] = t2 <= r.t1 ? T(exp(dot(q, qkv + g.at(r.bb, t2, 1, r.h), g.hs) * g.scale - maxv) / sum) : T(0);
    __syncwarp();  // every lane's probabilities are written before any lane reads them
    T* o = static_cast<T*>(j.out) + (r.bb * g.t + r.t1) * g.c + r.h * g.hs;
    for (int64_t i = lane; i < g.hs; i += 32) {
        double acc = 0.0;
        for (int64_t t2 = 0; t2 <= r.t1; ++t2) acc += double(a[t2]) * double(qkv[g.at(r.bb, t2, 2, r.h) + i]);
        o[i] = T(acc);
    }
}

// dot_a[bb, h, t1] = sum_t2 att[t1, t2] datt[t1, t2], datt[t1, t2] = dout[t1] . v[t2] (double):
// the softmax backward's row term.
template <class T>
__global__ void attention_rowdot_kernel(detail::AttentionJob j, Heads g, double* dot_a) {
    const Row r = warp_row(g);
    if (!r.valid) return;
    const int lane = threadIdx.x % 32;
    const T* qkv = static_cast<const T*>(j.qkv);
    const T* gr = static_cast<const T*>(j.dout) + (r.bb * g.t + r.t1) * g.c + r.h * g.hs;
    const T* a = static_cast<const T*>(j.saved_att) + ((r.bb * g.nh + r.h) * g.t + r.t1) * g.t;
    double s = 0.0;
    for (int64_t t2 = lane; t2 <= r.t1; t2 += 32) s += double(a[t2]) * dot(gr, qkv + g.at(r.bb, t2, 2, r.h), g.hs);
    s = warp_reduce(s, Sum{});
    if (lane == 0) dot_a[(r.bb * g.nh + r.h) * g.t + r.t1] = s;
}

// ds[t1, t2] = att[t1, t2] (datt[t1, t2] - dot_a[t1]) scale, the score gradient (double).
template <class T>
__device__ double score_grad(const detail::AttentionJob& j, const Heads& g, const double* dot_a, int64_t bb, int64_t h,
                             int64_t t1, int64_t t2) {
    const T* qkv = static_cast<const T*>(j.qkv);
    const T* gr = static_cast<const T*>(j.dout) + (bb * g.t + t1) * g.c + h * g.hs;
    const double a = double(static_cast<const T*>(j.saved_att)[((bb * g.nh + h) * g.t + t1) * g.t + t2]);
    return a * (dot(gr, qkv + g.at(bb, t2, 2, h), g.hs) - dot_a[(bb * g.nh + h) * g.t + t1]) * g.scale;
}

// dq[t1] = sum over t2 <= t1 (ascending) of T(ds[t1, t2] k[t2]): the lanes compute 32 ds at a
// time, then each lane adds them, in order, into its elements of dq.
template <class T>
__global__ void attention_dq_kernel(detail::AttentionJob j, Heads g, const double* dot_a) {
    const Row r = warp_row(g);
    if (!r.valid) return;
    const int lane = threadIdx.x % 32;
    const T* qkv = static_cast<const T*>(j.qkv);
    T* dq = static_cast<T*>(j.dqkv) + g.at(r.bb, r.t1, 0, r.h);
    for (int64_t i0 = 0; i0 < g.hs; i0 += 32) {
        const int64_t i = i0 + lane;
        T acc = T(0);
        for (int64_t c0 = 0; c0 <= r.t1; c0 += 32) {
            const double mine = c0 + lane <= r.t1 ? score_grad<T>(j, g, dot_a, r.bb, r.h, r.t1, c0 + lane) : 0.0;
            for (int k = 0; k < 32 && c0 + k <= r.t1; ++k) {
                const double ds = __shfl_sync(0xffffffffu, mine, k);
                if (i < g.hs) acc += T(ds * double(qkv[g.at(r.bb, c0 + k, 1, r.h) + i]));
            }
        }
        if (i < g.hs) dq[i] = acc;
    }
}

// For the warp's t2 (its row index read as t2): dk[t2] = sum over t1 >= t2 (ascending) of
// T(ds[t1, t2] q[t1]) and dv[t2] = sum of att[t1, t2] dout[t1], in T.
template <class T>
__global__ void attention_dkv_kernel(detail::AttentionJob j, Heads g, const double* dot_a) {
    const Row r = warp_row(g);
    if (!r.valid) return;
    const int lane = threadIdx.x % 32;
    const int64_t t2 = r.t1;
    const T* qkv = static_cast<const T*>(j.qkv);
    const T* dout = static_cast<const T*>(j.dout);
    const T* att = static_cast<const T*>(j.saved_att) + (r.bb * g.nh + r.h) * g.t * g.t;
    T* dk = static_cast<T*>(j.dqkv) + g.at(r.bb, t2, 1, r.h);
    T* dv = static_cast<T*>(j.dqkv) + g.at(r.bb, t2, 2, r.h);
    for (int64_t i0 = 0; i0 < g.hs; i0 += 32) {
        const int64_t i = i0 + lane;
        T acc_k = T(0), acc_v = T(0);
        for (int64_t c0 = t2; c0 < g.t; c0 += 32) {
            const double mine = c0 + lane < g.t ? score_grad<T>(j, g, dot_a, r.bb, r.h, c0 + lane, t2) : 0.0;
            for (int k = 0; k < 32 && c0 + k < g.t; ++k) {
                const int64_t t1 = c0 + k;
                const double ds = __shfl_sync(0xffffffffu, mine, k);
                if (i < g.hs) {
                    acc_k += T(ds * double(qkv[g.at(r.bb, t1, 0, r.h) + i]));
                    acc_v += att[t1 * g.t + t2] * dout[(r.bb * g.t + t1) * g.c + r.h * g.hs + i];
                }
            }
        }
        if (i < g.hs) {
            dk[i] = acc_k;
            dv[i] = acc_v;
        }
    }
}

unsigned warp_blocks(const Heads& g) {
    const int64_t warps = g.b * g.nh * g.t;
    return unsigned((warps + warps_per_block - 1) / warps_per_block);
}

// attention_decode: block (b, h, s) - one query row; thread x scores key t0 + x of each block of
// decode_threads keys, then the threads share the value rows' d columns (up to 4 each: d <= 512).
constexpr int decode_threads = 128;

// The block's max (NaN kept: a NaN score reaches out) or sum of one value a thread; red [4].
template <bool Max>
__device__ float block_reduce(float x, float* red) {
    for (int o = 16; o > 0; o /= 2) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = Max ? (x != x || y < x ? x : y) : x + y;
    }
    __syncthreads();  // red's previous reads are done
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < decode_threads / 32; ++w) r = Max ? (r != r || red[w] < r ? r : red[w]) : r + red[w];
    return r;
}

template <class T>
__global__ void attention_decode_kernel(detail::AttentionDecodeJob j) {
    __shared__ float qf[512], p[decode_threads], red[decode_threads / 32];
    const int64_t row = blockIdx.x, s = row % j.s, h = row / j.s % j.hq, b = row / (j.s * j.hq);
    const int64_t d = j.d, l = j.l;
    const T* q = static_cast<const T*>(j.q) + ((b * j.hq + h) * j.s + s) * d;
    const int64_t kv = (b * j.hkv + h / (j.hq / j.hkv)) * l * d;
    const T* k = static_cast<const T*>(j.k) + kv;  // [l, d]
    const T* v = static_cast<const T*>(j.v) + kv;  // [l, d]
    const uint8_t* m = j.mask ? j.mask + ((j.mask_b == 1 ? 0 : b) * j.s + s) * l : nullptr;  // [l]
    for (int64_t i = threadIdx.x; i < d; i += decode_threads) qf[i] = float(q[i]) * float(j.scale);
    __syncthreads();
    float mx = -INFINITY, sum = 0.0f, acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t t0 = 0; t0 < l; t0 += decode_threads) {
        const int64_t t = t0 + threadIdx.x;
        const bool mine = t < l && (m == nullptr || m[t] != 0);
        float sc = -INFINITY;
        if (mine) {
            sc = 0.0f;
            for (int64_t i = 0; i < d; ++i) sc += qf[i] * float(k[t * d + i]);
        }
        const float bm = block_reduce<true>(sc, red);
        if (bm == -INFINITY) continue;  // no key of this block attended (the same in every thread)
        const float mn = bm != bm ? bm : fmaxf(mx, bm), corr = expf(mx - mn);
        const float e = mine ? expf(sc - mn) : 0.0f;
        sum = sum * corr + block_reduce<false>(e, red);
        p[threadIdx.x] = e;
        __syncthreads();
        const int64_t tn = l - t0 < decode_threads ? l - t0 : decode_threads;
        for (int c = 0; c < 4; ++c) {
            const int64_t i = threadIdx.x + int64_t(c) * decode_threads;
            if (i >= d) break;
            float a = acc[c] * corr;
            for (int64_t u = 0; u < tn; ++u)
                if (m == nullptr || m[t0 + u] != 0) a += p[u] * float(v[(t0 + u) * d + i]);  // a masked value is not read
            acc[c] = a;
        }
        mx = mn;
        __syncthreads();  // p is read before the next block writes it
    }
    T* o = static_cast<T*>(j.out) + ((b * j.s + s) * j.hq + h) * d;
    for (int c = 0; c < 4; ++c) {
        const int64_t i = threadIdx.x + int64_t(c) * decode_threads;
        if (i < d) o[i] = T(sum == 0.0f ? 0.0f : acc[c] / sum);
    }
}

}  // namespace

void attention_decode(const detail::AttentionDecodeJob& j) {
    const int64_t rows = j.b * j.hq * j.s;
    if (rows > 0x7fffffff) throw Error("fp8kit::attention_decode: " + std::to_string(rows) + " query rows, the cuda backend takes at most 2^31 - 1");
    detail::with_storage_type(j.dtype, [&]<class T>(T) {
        attention_decode_kernel<T><<<unsigned(rows), decode_threads, 0, stream_of(j.ctx)>>>(j);
    });
    check_launch("attention_decode_kernel");
}

void attention_forward(const detail::AttentionJob& j) {
    const Heads g = heads_of(j);
    if (g.b * g.nh * g.t == 0 || g.hs == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        attention_forward_kernel<T><<<warp_blocks(g), 32 * warps_per_block, 0, stream_of(j.ctx)>>>(j, g);
    });
    check_launch("attention_forward_kernel");
}

void attention_backward(const detail::AttentionJob& j) {
    const Heads g = heads_of(j);
    if (g.b * g.nh * g.t == 0 || g.hs == 0) return;
    const cudaStream_t s = stream_of(j.ctx);
    const std::shared_ptr<std::byte> rowdot = allocate(size_t(g.b * g.nh * g.t) * sizeof(double));
    auto* dot_a = reinterpret_cast<double*>(rowdot.get());
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        attention_rowdot_kernel<T><<<warp_blocks(g), 32 * warps_per_block, 0, s>>>(j, g, dot_a);
        check_launch("attention_rowdot_kernel");
        attention_dq_kernel<T><<<warp_blocks(g), 32 * warps_per_block, 0, s>>>(j, g, dot_a);
        check_launch("attention_dq_kernel");
        attention_dkv_kernel<T><<<warp_blocks(g), 32 * warps_per_block, 0, s>>>(j, g, dot_a);
        check_launch("attention_dkv_kernel");
    });
}

}  // namespace fp8kit::cuda
