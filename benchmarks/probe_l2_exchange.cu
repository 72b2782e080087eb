// What it costs two CTAs of a cluster to exchange half a KV tile each through the L2, a tile
// at a time: the form the sparse ping-pong route would take to convert each packed row once a
// token at 128 heads (each of the token's two 64-row programs converts half of every tile and
// takes the other half from its peer; design/sparse-pingpong16.md). Written directly in CUDA
// C++, so the rate does not depend on what Triton emits.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o l2x probe_l2_exchange.cu
//   ./l2x
//
// One CTA of 128 threads (the producer warpgroup) per SM (dynamic shared memory keeps a second
// off), clusters of two, 256 clusters (the 512 programs of B128_H128_K2048_Q2), 64 tiles each.
// Per tile each CTA: waits until its peer has taken the tile that last used the scratch slot,
// writes its half (16 rows x 1,152 bytes of fp16) into the slot, publishes the tile's number
// (bar.sync, then one thread's st.release.gpu), then takes its peer's tile j - LAG: waits for
// the peer's number (ld.acquire.gpu), copies the half into shared memory (cp.async.cg: through
// the L2 only), checks it and acknowledges the slot. WORK cycles of busy waiting a tile stand
// in for the conversion that the exchange would overlap. Variants: `none` (the loop and the
// work only), `local` (each CTA writes its own slot and reads it back: the traffic without a
// peer), `exchange` at lags 0-3. Printed: us a launch (the median of 7), ns a tile (a CTA's,
// over ~3.9 waves), us over `none`, and the words that came back wrong (must be 0).
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

constexpr int THREADS = 128, HALF_WORDS = 16 * 1152 / 16, PER_THREAD = HALF_WORDS / THREADS;
constexpr int TILES = 64, CLUSTERS = 256, SLOTS = 4, SMEM = 160 * 1024;
static_assert(HALF_WORDS % THREADS == 0, "a half tile in whole 16-byte words a thread");

enum Mode { NONE = 0, LOCAL = 1, EXCHANGE = 2 };

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void wait_at_least(const uint32_t* p, uint32_t v) {
  while (ld_acquire(p) < v) {}
}
__device__ __forceinline__ void busy(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
__device__ __forceinline__ uint4 word(uint32_t cluster, uint32_t rank, uint32_t tile, uint32_t i) {
  uint32_t x = (cluster * 2 + rank) * 0x9E3779B1u ^ tile * 0x85EBCA77u ^ i;
  return make_uint4(x, x + 1, x + 2, x + 3);
}

// scratch: [cluster][rank][slot][HALF_WORDS]; flags: [cluster][rank] x 64 uint32, the tile
// published at [0], the peer's tile taken at [32] (two 128-byte lines)
__global__ void __launch_bounds__(THREADS, 1)
exchange(uint4* scratch, uint32_t* flags, int mode, int lag, long long work, uint32_t base,
         unsigned long long* wrong) {
  extern __shared__ uint4 smem[];
  uint32_t rank;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  const uint32_t cl = blockIdx.x / 2, peer = mode == LOCAL ? rank : rank ^ 1;
  uint4* mine = scratch + ((size_t)cl * 2 + rank) * SLOTS * HALF_WORDS;
  uint4* theirs = scratch + ((size_t)cl * 2 + peer) * SLOTS * HALF_WORDS;
  uint32_t* my_flags = flags + (cl * 2 + rank) * 64;
  uint32_t* peer_flags = flags + (cl * 2 + peer) * 64;
  const int t = threadIdx.x;
  unsigned long long bad = 0;
  // flags count from `base` (each launch a new range: no reset between launches)
  for (int j = 0; j < TILES + lag; ++j) {
    if (j < TILES) {
      busy(work);
      if (mode != NONE) {
        // the slot's previous tile taken by the reader before it is overwritten
        if (j >= SLOTS && t == 0) wait_at_least(peer_flags + 32, base + j - SLOTS + 1);
        __syncthreads();
        uint4* dst = mine + (j % SLOTS) * HALF_WORDS;
        for (int k = 0; k < PER_THREAD; ++k) {
          int i = k * THREADS + t;
          uint4 w = word(cl, rank, j, i);
          asm volatile("st.global.cg.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(dst + i), "r"(w.x),
                       "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
        }
        __syncthreads();
        if (t == 0) st_release(my_flags, base + j + 1);
      }
    }
    const int r = j - lag;  // the peer's tile taken now
    if (mode != NONE && r >= 0) {
      if (t == 0) wait_at_least(peer_flags, base + r + 1);
      __syncthreads();
      const uint4* src = theirs + (r % SLOTS) * HALF_WORDS;
      uint4* buf = smem + (r % 2) * HALF_WORDS;
      for (int k = 0; k < PER_THREAD; ++k) {
        int i = k * THREADS + t;
        uint32_t s = (uint32_t)__cvta_generic_to_shared(buf + i);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src + i) : "memory");
      }
      asm volatile("cp.async.commit_group; cp.async.wait_group 0;" ::: "memory");
      for (int k = 0; k < PER_THREAD; ++k) {
        int i = k * THREADS + t;
        uint4 w = buf[i], e = word(cl, peer, r, i);
        bad += (w.x != e.x) | (w.y != e.y) | (w.z != e.z) | (w.w != e.w);
      }
      __syncthreads();
      // the reader's acknowledgement: the slot may be written again (LOCAL: its own)
      if (t == 0) st_release(my_flags + 32, base + r + 1);
    }
  }
  if (bad) atomicAdd(wrong, bad);
}

int main() {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("%s, %d SMs\n", prop.name, sms);
  uint4* scratch;
  uint32_t* flags;
  unsigned long long* wrong;
  CK(cudaMalloc(&scratch, (size_t)CLUSTERS * 2 * SLOTS * HALF_WORDS * 16));
  CK(cudaMalloc(&flags, (size_t)CLUSTERS * 2 * 64 * 4));
  CK(cudaMalloc(&wrong, 8));
  CK(cudaFuncSetAttribute(exchange, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(CLUSTERS * 2);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = SMEM;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  struct V { const char* name; int mode, lag; };
  const V variants[] = {{"none", NONE, 0}, {"local", LOCAL, 0}, {"exchange lag 0", EXCHANGE, 0},
                        {"exchange lag 1", EXCHANGE, 1}, {"exchange lag 2", EXCHANGE, 2},
                        {"exchange lag 3", EXCHANGE, 3}};
  const long long works[] = {0, 2000};
  printf("%-16s %6s %10s %10s %12s %8s\n", "variant", "work", "us", "ns/tile", "+us/none", "wrong");
  for (long long work : works) {
    double none_us = 0;
    for (const V& v : variants) {
      CK(cudaMemset(flags, 0, (size_t)CLUSTERS * 2 * 64 * 4));
      CK(cudaMemset(wrong, 0, 8));
      uint32_t base = 0;
      std::vector<float> ts;
      for (int rep = 0; rep < 8; ++rep) {
        CK(cudaEventRecord(e0));
        CK(cudaLaunchKernelEx(&cfg, exchange, scratch, flags, v.mode, v.lag, work, base, wrong));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep) ts.push_back(ms * 1000);  // the first launch warms up
        base += TILES;
      }
      std::sort(ts.begin(), ts.end());
      unsigned long long w;
      CK(cudaMemcpy(&w, wrong, 8, cudaMemcpyDeviceToHost));
      double us = ts[ts.size() / 2];
      if (v.mode == NONE) none_us = us;
      // a tile's time: 4 waves of clusters (256 clusters, sms / 2 at once), TILES tiles each
      double waves = (double)CLUSTERS * 2 / sms;
      double per_tile_ns = us * 1000 / (waves * TILES);
      printf("%-16s %6lld %10.1f %10.1f %12.1f %8llu\n", v.name, work, us, per_tile_ns,
             us - none_us, w);
    }
  }
  return 0;
}
