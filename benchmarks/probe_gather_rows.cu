// How fast one program per SM gathers 576-byte FP8 rows (512 latent + 64 RoPE bytes) through
// a slot table into shared memory, with nothing consuming them, written directly in CUDA C++
// so the rate does not depend on what Triton emits: cp.async of 16 bytes per thread (as the
// FP8 × FP8 kernel's copier) against one TMA bulk copy per row (cp.async.bulk, completing on
// an mbarrier), at the decode kernel's shapes (programs × tiles of 64 tokens).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o gather probe_gather_rows.cu -lcuda
//   ./gather
//
// Each variant's last tile per program is checked byte for byte against the pool; the time is
// per launch within a CUDA graph of 8 launches over different random slot sets (so the graph
// launch's own overhead is not in it). Variants: cp.async as consecutive 16-byte chunks (a warp
// covers 512 contiguous bytes), cp.async in the Gluon copier's pattern (4 rows × 128 bytes per
// warp instruction) completing by wait_group or by an mbarrier, TMA bulk copies issued by 2 or 4
// warps. Results: NOTES.md round 21.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <random>
#include <cuda.h>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
constexpr int ROW = 576, TILE = 64, TILEB = ROW * TILE;

__device__ __forceinline__ uint32_t sa(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

template <int STAGES>
__global__ void __launch_bounds__(128, 1) g_cpasync(const uint8_t* __restrict__ pool, const int* __restrict__ slots, int tiles, uint8_t* keep) {
  extern __shared__ __align__(128) uint8_t sm[];
  const int t = threadIdx.x;
  const int* sl = slots + (size_t)blockIdx.x * tiles * TILE;
  // thread t copies chunks c = t + 128*i, i<18: row c/36, chunk c%36
  int s_next[18];
#pragma unroll
  for (int i = 0; i < 18; i++) s_next[i] = sl[(t + 128 * i) / 36];
  for (int j = 0; j < tiles; j++) {
    int s_cur[18];
#pragma unroll
    for (int i = 0; i < 18; i++) s_cur[i] = s_next[i];
    if (j + 1 < tiles) {
#pragma unroll
      for (int i = 0; i < 18; i++) s_next[i] = sl[(j + 1) * TILE + (t + 128 * i) / 36];
    }
    uint8_t* st = sm + (j % STAGES) * TILEB;
#pragma unroll
    for (int i = 0; i < 18; i++) {
      int c = t + 128 * i; int r = c / 36, k = c % 36;
      const uint8_t* src = pool + (size_t)s_cur[i] * ROW + k * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sa(st + r * ROW + k * 16)), "l"(src));
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 1));
  }
  asm volatile("cp.async.wait_group 0;");
  __syncthreads();
  uint8_t* st = sm + ((tiles - 1) % STAGES) * TILEB;
  for (int c = t; c < TILEB / 16; c += 128) ((int4*)(keep + (size_t)blockIdx.x * TILEB))[c] = ((int4*)st)[c];
}

__device__ __forceinline__ void mb_init(uint64_t* b, int n) { asm volatile("mbarrier.init.shared.b64 [%0], %1;" :: "r"(sa(b)), "r"(n)); }
__device__ __forceinline__ void mb_expect(uint64_t* b, int bytes) { asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(sa(b)), "r"(bytes)); }
__device__ __forceinline__ void mb_wait(uint64_t* b, int phase) {
  asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n @!p bra W;\n}" :: "r"(sa(b)), "r"(phase));
}
__device__ __forceinline__ void bulk(void* dst, const void* src, int bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(b)) : "memory");
}

// W warps issue; warp w takes rows w*64/W ..; each lane issues (64/W)/32 rows (or fewer lanes active).
// SPLIT: 0 one 576-B copy per row, 1 two copies (512 + 64) into separate areas.
template <int STAGES, int W, int SPLIT>
__global__ void __launch_bounds__(W * 32, 1) g_bulk(const uint8_t* __restrict__ pool, const int* __restrict__ slots, int tiles, uint8_t* keep) {
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ __align__(8) uint64_t full[STAGES];
  const int t = threadIdx.x;
  const int* sl = slots + (size_t)blockIdx.x * tiles * TILE;
  if (t == 0) { for (int s = 0; s < STAGES; s++) mb_init(&full[s], 1); asm volatile("fence.mbarrier_init.release.cluster;"); }
  __syncthreads();
  constexpr int RPT = (TILE + W * 32 - 1) / (W * 32);  // rows per thread
  int nx[RPT];
#pragma unroll
  for (int i = 0; i < RPT; i++) { int r = t + i * W * 32; nx[i] = r < TILE ? sl[r] : 0; }
  for (int j = 0; j < tiles; j++) {
    int cu[RPT];
#pragma unroll
    for (int i = 0; i < RPT; i++) { cu[i] = nx[i]; int r = t + i * W * 32; if (j + 1 < tiles && r < TILE) nx[i] = sl[(j + 1) * TILE + r]; }
    int s = j % STAGES;
    if (j >= STAGES) mb_wait(&full[s], ((j / STAGES) - 1) & 1);  // stage consumed (nothing consumes: just landed)
    __syncwarp();
    if (t == 0) mb_expect(&full[s], TILEB);
    uint8_t* st = sm + s * TILEB;
#pragma unroll
    for (int i = 0; i < RPT; i++) {
      int r = t + i * W * 32;
      if (r < TILE) {
        const uint8_t* src = pool + (size_t)cu[i] * ROW;
        if (SPLIT == 0) bulk(st + r * ROW, src, ROW, &full[s]);
        else { bulk(st + r * 512, src, 512, &full[s]); bulk(st + TILE * 512 + r * 64, src + 512, 64, &full[s]); }
      }
    }
  }
  for (int j = (tiles > STAGES ? tiles - STAGES : 0); j < tiles; j++) mb_wait(&full[j % STAGES], (j / STAGES) & 1);
  __syncthreads();
  uint8_t* st = sm + ((tiles - 1) % STAGES) * TILEB;
  if (SPLIT == 0) { for (int c = t; c < TILEB / 16; c += W * 32) ((int4*)(keep + (size_t)blockIdx.x * TILEB))[c] = ((int4*)st)[c]; }
  else { for (int c = t; c < TILEB; c += W * 32) { int r = c / ROW, k = c % ROW; keep[(size_t)blockIdx.x * TILEB + c] = k < 512 ? st[r * 512 + k] : st[TILE * 512 + r * 64 + k - 512]; } }
}


// The Gluon copier's pattern: per 128-byte column block c, each warp instruction copies 4 rows'
// 128 bytes (8 lanes a row); 4 rows per thread; the RoPE 64 bytes as [8 rows x 4 lanes]. MB: completion by
// cp.async.mbarrier.arrive.noinc on a per-stage mbarrier (as Gluon), else wait_group.
template <int STAGES, bool MB>
__global__ void __launch_bounds__(128, 1) g_gluonlike(const uint8_t* __restrict__ pool, const int* __restrict__ slots, int tiles, uint8_t* keep) {
  extern __shared__ __align__(128) uint8_t sm[];
  __shared__ __align__(8) uint64_t full[STAGES];
  const int t = threadIdx.x, lane = t & 31, w = t >> 5;
  const int* sl = slots + (size_t)blockIdx.x * tiles * TILE;
  if (MB) { if (t == 0) { for (int s = 0; s < STAGES; s++) mb_init(&full[s], 128); asm volatile("fence.mbarrier_init.release.cluster;"); } __syncthreads(); }
  // latent rows of this thread: r = w*16 + (lane/8) + 4*i (i<4); RoPE rows: w*16 + lane/4 + 8*i (i<2)
  int nx[4], pnx[2];
#pragma unroll
  for (int i = 0; i < 4; i++) nx[i] = sl[w * 16 + (lane >> 3) + 4 * i];
#pragma unroll
  for (int i = 0; i < 2; i++) pnx[i] = sl[w * 16 + (lane >> 2) + 8 * i];
  for (int j = 0; j < tiles; j++) {
    int s = j % STAGES;
    if (MB && j >= STAGES) mb_wait(&full[s], ((j / STAGES) - 1) & 1);
    int cu[4], pcu[2];
#pragma unroll
    for (int i = 0; i < 4; i++) { cu[i] = nx[i]; if (j + 1 < tiles) nx[i] = sl[(j + 1) * TILE + w * 16 + (lane >> 3) + 4 * i]; }
#pragma unroll
    for (int i = 0; i < 2; i++) { pcu[i] = pnx[i]; if (j + 1 < tiles) pnx[i] = sl[(j + 1) * TILE + w * 16 + (lane >> 2) + 8 * i]; }
    uint8_t* st = sm + s * TILEB;
#pragma unroll
    for (int c = 0; c < 4; c++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        int r = w * 16 + (lane >> 3) + 4 * i, k = c * 128 + (lane & 7) * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sa(st + r * ROW + k)), "l"(pool + (size_t)cu[i] * ROW + k));
      }
#pragma unroll
    for (int i = 0; i < 2; i++) {
      int r = w * 16 + (lane >> 2) + 8 * i, k = 512 + (lane & 3) * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sa(st + r * ROW + k)), "l"(pool + (size_t)pcu[i] * ROW + k));
    }
    if (MB) asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" :: "r"(sa(&full[s])));
    else { asm volatile("cp.async.commit_group;"); asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 1)); }
  }
  if (MB) { for (int j = (tiles > STAGES ? tiles - STAGES : 0); j < tiles; j++) mb_wait(&full[j % STAGES], (j / STAGES) & 1); }
  else asm volatile("cp.async.wait_group 0;");
  __syncthreads();
  uint8_t* st = sm + ((tiles - 1) % STAGES) * TILEB;
  for (int c = t; c < TILEB / 16; c += 128) ((int4*)(keep + (size_t)blockIdx.x * TILEB))[c] = ((int4*)st)[c];
}

constexpr int TMA_STAGE = 32768 + 64 * 128;  // latent blocks, then RoPE rows 128 B apart
// TMA tensor copies of one row × 128 bytes (4 per token) and one row × 64 bytes (the RoPE
// part) into the FP8 × FP8 kernel's stage shape (four [64 rows, 128 B] column blocks, then
// [64, 64 B]). W warps issue, one token per lane; completion on an mbarrier. With SWZ the
// latent map uses the 128-byte swizzle wgmma reads (the TMA unit swizzles by destination
// address), else none. A TMA destination must be 128-byte aligned, so the RoPE rows land
// 128 bytes apart here (unswizzled; the kernel's [64, 64 B] RoPE tile could not be built
// this way: its odd rows start 64 bytes into a line).
template <int STAGES, int W, bool SWZ>
__global__ void __launch_bounds__(W * 32, 1) g_tma_rows(const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tp, const int* __restrict__ slots, int tiles, uint8_t* keep) {
  extern __shared__ __align__(1024) uint8_t smt_raw[];
  // the stages on a 1024-byte boundary (static shared memory comes first): a TMA destination
  // is 128-byte aligned, a swizzled one starts its swizzle atom on 1024 bytes
  uint8_t* smt = (uint8_t*)(((uintptr_t)smt_raw + 1023) & ~(uintptr_t)1023);
  __shared__ __align__(8) uint64_t full[STAGES];
  const int t = threadIdx.x;
  const int* sl = slots + (size_t)blockIdx.x * tiles * TILE;
  if (t == 0) { for (int s = 0; s < STAGES; s++) mb_init(&full[s], 1); asm volatile("fence.mbarrier_init.release.cluster;"); }
  __syncthreads();
  constexpr int RPT = (TILE + W * 32 - 1) / (W * 32);
  int nx[RPT];
#pragma unroll
  for (int i = 0; i < RPT; i++) { int r = t + i * W * 32; nx[i] = r < TILE ? sl[r] : 0; }
  for (int j = 0; j < tiles; j++) {
    int s = j % STAGES;
    if (j >= STAGES) mb_wait(&full[s], ((j / STAGES) - 1) & 1);
    __syncwarp();
    if (t == 0) mb_expect(&full[s], TILEB);  // 64 × (4 × 128 + 64) bytes
    uint8_t* st = smt + s * TMA_STAGE;
#pragma unroll
    for (int i = 0; i < RPT; i++) {
      int r = t + i * W * 32;
      int slot = nx[i];
      if (j + 1 < tiles && r < TILE) nx[i] = sl[(j + 1) * TILE + r];
      if (r < TILE) {
#pragma unroll
        for (int c = 0; c < 4; c++)
          asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                       :: "r"(sa(st + c * 8192 + r * 128)), "l"(&tk), "r"(c * 128), "r"(slot), "r"(sa(&full[s])) : "memory");
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(sa(st + 32768 + r * 128)), "l"(&tp), "r"(512), "r"(slot), "r"(sa(&full[s])) : "memory");
      }
    }
  }
  for (int j = (tiles > STAGES ? tiles - STAGES : 0); j < tiles; j++) mb_wait(&full[j % STAGES], (j / STAGES) & 1);
  __syncthreads();
  uint8_t* st = smt + ((tiles - 1) % STAGES) * TMA_STAGE;
  for (int c = t; c < TILEB; c += W * 32) {  // un-swizzled back to [64 rows, 576 B]
    int r = c / ROW, k = c % ROW, o;
    int sw = SWZ ? r % 8 : 0;
    if (k < 512) o = (k / 128) * 8192 + r * 128 + ((((k % 128) / 16) ^ sw) * 16) + k % 16;
    else o = 32768 + r * 128 + (k - 512);
    keep[(size_t)blockIdx.x * TILEB + c] = st[o];
  }
}

static CUtensorMap tensor_map(const uint8_t* pool, size_t slots, int box, CUtensorMapSwizzle sw) {
  CUtensorMap m;
  cuuint64_t dims[2] = {ROW, slots}, strides[1] = {ROW};
  cuuint32_t boxd[2] = {(cuuint32_t)box, 1}, es[2] = {1, 1};
  CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void*)pool, dims, strides, boxd, es,
                                      CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) { printf("cuTensorMapEncodeTiled failed: %d\n", (int)r); exit(1); }
  return m;
}
static CUtensorMap g_tk, g_tp, g_tk0, g_tp0;
typedef void (*Launcher)(const uint8_t*, const int*, int, uint8_t*, int, int, int, cudaStream_t);
template <void (*K)(const uint8_t*, const int*, int, uint8_t*)>
void run_k(const uint8_t* pool, const int* sl, int tiles, uint8_t* keep, int programs, int threads, int smem, cudaStream_t s) {
  K<<<programs, threads, smem, s>>>(pool, sl, tiles, keep);
}
template <int STAGES, int W, bool SWZ>
void run_tma(const uint8_t*, const int* sl, int tiles, uint8_t* keep, int programs, int threads, int smem, cudaStream_t s) {
  g_tma_rows<STAGES, W, SWZ><<<programs, threads, smem, s>>>(SWZ ? g_tk : g_tk0, SWZ ? g_tp : g_tp0, sl, tiles, keep);
}

__global__ void readk(const int4* p, size_t n, int4* o) {
  int4 a = {0, 0, 0, 0};
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) { int4 v = __ldcs(p + i); a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w; }
  if (a.x == 0x12345 && a.y == 7) o[0] = a;
}

struct Case { const char* name; int programs, tiles; bool sorted; };

int main() {
  const size_t SLOTS = 495552;
  cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0));
  printf("%s, %d SMs, L2 %d MB\n", pr.name, pr.multiProcessorCount, pr.l2CacheSize >> 20);
  uint8_t* pool; CK(cudaMalloc(&pool, SLOTS * ROW));
  std::vector<uint8_t> hp(SLOTS * ROW); std::mt19937 g(1); for (auto& b : hp) b = g();
  CK(cudaMemcpy(pool, hp.data(), hp.size(), cudaMemcpyHostToDevice));
  // streaming read rate
  { size_t n = SLOTS * ROW / 16; int4* o; CK(cudaMalloc(&o, 16)); cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (int w = 0; w < 3; w++) readk<<<132 * 8, 512>>>((int4*)pool, n, o);
    cudaEventRecord(a); for (int r = 0; r < 20; r++) readk<<<132 * 8, 512>>>((int4*)pool, n, o); cudaEventRecord(b); CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b); printf("streaming read of the pool: %.2f TB/s\n", SLOTS * ROW * 20 / (ms * 1e-3) / 1e12); }
  Case cases[] = {{"128x16 random", 128, 16, false}, {"132x64 random", 132, 64, false}, {"128x32 random", 128, 32, false}};
  const int REPS = 8;
  g_tk = tensor_map(pool, SLOTS, 128, CU_TENSOR_MAP_SWIZZLE_128B);
  g_tp = tensor_map(pool, SLOTS, 64, CU_TENSOR_MAP_SWIZZLE_NONE);
  g_tk0 = tensor_map(pool, SLOTS, 128, CU_TENSOR_MAP_SWIZZLE_NONE);
  g_tp0 = g_tp;
  struct V { const char* name; Launcher k; const void* f; int threads, smem; };
  V vs[] = {
    {"cp.async 4 stages", run_k<g_cpasync<4>>, (const void*)g_cpasync<4>, 128, 4 * TILEB},
    {"cp.async gluon-like wg", run_k<g_gluonlike<4, false>>, (const void*)g_gluonlike<4, false>, 128, 4 * TILEB},
    {"cp.async gluon-like mbar", run_k<g_gluonlike<4, true>>, (const void*)g_gluonlike<4, true>, 128, 4 * TILEB},
    {"tma 1x128 rows unswizzled, 2 warps", run_tma<4, 2, false>, (const void*)g_tma_rows<4, 2, false>, 64, 4 * TMA_STAGE + 1024},
    {"tma 1x128 rows swizzled, 2 warps", run_tma<4, 2, true>, (const void*)g_tma_rows<4, 2, true>, 64, 4 * TMA_STAGE + 1024},
    {"tma 1x128 rows swizzled, 4 warps", run_tma<4, 4, true>, (const void*)g_tma_rows<4, 4, true>, 128, 4 * TMA_STAGE + 1024},
    {"gluon-like mbar 2 stages", run_k<g_gluonlike<2, true>>, (const void*)g_gluonlike<2, true>, 128, 2 * TILEB},
    {"gluon-like mbar 3 stages", run_k<g_gluonlike<3, true>>, (const void*)g_gluonlike<3, true>, 128, 3 * TILEB},
    {"bulk 2 warps 4 st", run_k<g_bulk<4, 2, 0>>, (const void*)g_bulk<4, 2, 0>, 64, 4 * TILEB},
    {"bulk 4 warps 4 st", run_k<g_bulk<4, 4, 0>>, (const void*)g_bulk<4, 4, 0>, 128, 4 * TILEB},
  };
  for (auto& v : vs) CK(cudaFuncSetAttribute(v.f, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));
  for (auto& c : cases) {
    size_t n = (size_t)c.programs * c.tiles * TILE;
    std::vector<int> hs(n * REPS);
    for (int r = 0; r < REPS; r++) {
      if (c.sorted) { size_t base = g() % (SLOTS - n); for (size_t i = 0; i < n; i++) hs[r * n + i] = base + i; }
      else for (size_t i = 0; i < n; i++) hs[r * n + i] = g() % SLOTS;
    }
    int* sl; CK(cudaMalloc(&sl, hs.size() * 4)); CK(cudaMemcpy(sl, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    uint8_t* keep; CK(cudaMalloc(&keep, (size_t)c.programs * TILEB));
    std::vector<uint8_t> hk((size_t)c.programs * TILEB);
    for (auto& v : vs) {
      // correctness: rep 0
      CK(cudaMemset(keep, 0, hk.size()));
      v.k(pool, sl, c.tiles, keep, c.programs, v.threads, v.smem, 0); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(hk.data(), keep, hk.size(), cudaMemcpyDeviceToHost));
      long bad = 0;
      for (int p = 0; p < c.programs; p++) for (int r = 0; r < TILE; r++) {
        int s = hs[((size_t)p * c.tiles + c.tiles - 1) * TILE + r];
        for (int k = 0; k < ROW; k++) bad += hk[((size_t)p * TILE + r) * ROW + k] != hp[(size_t)s * ROW + k];
      }
      // timing: graph of REPS launches over different slot sets, replayed
      cudaStream_t s; cudaStreamCreate(&s); cudaGraph_t gr; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int r = 0; r < REPS; r++) v.k(pool, sl + r * n, c.tiles, keep, c.programs, v.threads, v.smem, s);
      CK(cudaStreamEndCapture(s, &gr)); CK(cudaGraphInstantiate(&ge, gr, 0));
      for (int w = 0; w < 3; w++) cudaGraphLaunch(ge, s);
      cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
      std::vector<float> ts;
      for (int it = 0; it < 15; it++) { cudaEventRecord(a, s); cudaGraphLaunch(ge, s); cudaEventRecord(b, s); CK(cudaEventSynchronize(b)); float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1e3f / REPS); }
      std::sort(ts.begin(), ts.end()); float us = ts[ts.size() / 2];
      printf("%-15s %-20s %8.2f us  %5.2f TB/s  bad bytes %ld\n", c.name, v.name, us, n * ROW / (us * 1e-6) / 1e12, bad);
      cudaGraphExecDestroy(ge); cudaGraphDestroy(gr); cudaStreamDestroy(s);
    }
    cudaFree(sl); cudaFree(keep);
  }
  return 0;
}
