// Host-side planning shared by the CUDA norm / softmax kernels: team shapes, grid sizes,
// alignment checks and the weight-gradient plan (kernels.cuh explains the kernel design).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda_check.hpp"
#include "core/device.hpp"
#include "norm/kernels.cuh"

namespace rudnn::norm::plan {

namespace {

constexpr std::size_t kDefaultSmemLimit = 48 * 1024;  // dynamic smem a kernel gets without opting in
constexpr std::size_t kFusedSmemCap = 96 * 1024;      // a fused block's accumulators when two share an SM
constexpr std::size_t kWorkspaceCap = std::size_t(64) << 20;

i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

int next_pow2(i64 v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

}  // namespace

RowLaunch row_shape(i64 chunks, int slot_target, int max_slots) {
  RowLaunch launch;
  if (chunks > i64(max_slots) * kern::kMaxTeam) {
    launch.stream = true;
    launch.team = kern::kStreamThreads;
    launch.block = kern::kStreamThreads;
    return launch;
  }
  // A power of two, so that sub-warp teams tile a warp; at most max_slots chunks per thread
  // (slot_target <= max_slots, and a team capped at kMaxTeam has chunks <= max_slots * kMaxTeam).
  launch.team = std::min(next_pow2(ceil_div(chunks, slot_target)), kern::kMaxTeam);
  launch.block = std::max(launch.team, kern::kRegsBlockTarget);
  return launch;
}

bool regs_pipelined(const RowLaunch& launch, int vec, bool collapsed) {
  if (launch.stream || vec == 1 || !collapsed || launch.team > kern::kRegsBlockTarget) return false;
  const char* env = std::getenv("RUDNN_NORM_PIPELINED");
  return !(env != nullptr && env[0] == '0');
}

int cluster_blocks(i64 rows, i64 chunks, int sm_count, bool capable, int slots) {
  const char* env = std::getenv("RUDNN_NORM_CLUSTER");
  const bool off = env != nullptr && env[0] == '0';
  const bool forced = env != nullptr && env[0] == '1';
  if (!capable || off || rows == 0 || chunks <= kern::kClusterThreads) return 0;
  const i64 block_chunks = i64(kern::kClusterThreads) * slots;
  const i64 needed = ceil_div(chunks, block_chunks);
  if (needed > kern::kMaxCluster) return 0;  // longer rows: the stream kernel
  if (!forced && needed < 2) return 0;       // rows one block holds: the register kernels (decode sizes)
  const bool stream_row = chunks > i64(slots) * kern::kMaxTeam;
  if (!forced && !(2 * rows <= sm_count || (stream_row && rows <= sm_count))) return 0;
  // The blocks one wave gives each row, at least those the row needs, at most one chunk per thread.
  const i64 fill = std::max<i64>(forced ? 2 : 1, sm_count / rows);
  const i64 blocks = std::min({i64(kern::kMaxCluster), std::max(needed, fill), ceil_div(chunks, kern::kClusterThreads)});
  return blocks >= 2 ? int(blocks) : 0;
}

void spread_rows_over(RowLaunch& launch, i64 rows, i64 max_blocks) {
  const int teams = launch.block / launch.team;
  const i64 groups = ceil_div(rows, teams);  // rows in units of one row per team
  const i64 blocks = std::min(groups, max_blocks);
  launch.rows_per_block = ceil_div(groups, blocks) * teams;
  launch.grid = int(ceil_div(rows, launch.rows_per_block));
}

WgradPlan wgrad_plan(i64 rows, i64 hidden, int sm_count, std::size_t optin) {
  WgradPlan plan;
  // Shared memory of a fused block: two per SM when two blocks' accumulators fit (at most 96 KB
  // each), else one per SM with all the opt-in memory. 2 KB per block stay free for the kernels'
  // static shared memory and the per-block reservation.
  const std::size_t two_per_sm = std::min<std::size_t>(kFusedSmemCap, optin / 2 - 2048);
  const std::size_t one_per_sm = optin - 2048;
  const std::size_t two_rows = std::size_t(hidden) * 2 * sizeof(float);  // one team's dweight + dbias
  int blocks_per_sm = 0;
  if (two_rows <= two_per_sm) {
    blocks_per_sm = 2;
    plan.fused_smem_budget = two_per_sm;
  } else if (two_rows <= one_per_sm) {
    blocks_per_sm = 1;
    plan.fused_smem_budget = one_per_sm;
  }
  plan.fused = blocks_per_sm > 0;
  if (rows == 0) {
    plan.splits = 0;
    return plan;
  }
  // Each split writes one partial row per gradient; cap them so the workspace stays bounded.
  const i64 cap = std::max<i64>(1, i64(kWorkspaceCap / two_rows));
  i64 target;
  if (plan.fused) {
    // One split per block of the dx kernel, one wave of resident blocks.
    target = std::min<i64>(rows, i64(blocks_per_sm) * sm_count);
  } else {
    // Column kernel: enough (column tile, row split) blocks to fill the GPU, >= 64 rows per split.
    const i64 column_tiles = ceil_div(hidden, kern::kWgradColumns);
    target = std::clamp<i64>(ceil_div(8 * i64(sm_count), column_tiles), 1, ceil_div(rows, 64));
  }
  target = std::min(target, cap);
  plan.rows_per_split = ceil_div(rows, target);
  plan.splits = ceil_div(rows, plan.rows_per_split);
  plan.workspace_bytes = plan.splits > 1 ? std::size_t(plan.splits) * two_rows : 0;
  return plan;
}

void fused_wgrad_launch(RowLaunch& launch, const WgradPlan& wgrad, i64 hidden, int max_block) {
  const std::size_t team_bytes = std::size_t(hidden) * 2 * sizeof(float);
  int teams = 1;
  if (!launch.stream) {
    // As many teams as the shared-memory budget and max_block threads allow, whole warps only.
    teams = int(std::min<std::size_t>(std::max(1, max_block / launch.team), wgrad.fused_smem_budget / team_bytes));
    if (launch.team < 32) teams = std::max(teams - teams % (32 / launch.team), 32 / launch.team);
    launch.block = teams * launch.team;
  }
  launch.smem = std::size_t(teams) * team_bytes;
  launch.grid = int(wgrad.splits);
  launch.rows_per_block = wgrad.rows_per_split;
}

// (tests/emulation/norm_emu.cpp runs the planning above this line on the CPU.)

int resident_blocks(const void* kernel, int block, std::size_t smem) {
  using Key = std::tuple<int, const void*, int, std::size_t>;
  static std::mutex mutex;
  static std::map<Key, int> cache;
  static std::map<std::pair<int, const void*>, bool> opted_in;

  const int device = core::current_device();
  std::lock_guard<std::mutex> lock(mutex);
  const Key key{device, kernel, block, smem};
  if (auto it = cache.find(key); it != cache.end()) return it->second;

  // Static and dynamic shared memory share the 48 KB a kernel gets without opting in: a block of
  // exactly 48 KB of dynamic memory plus a few static bytes fails to launch (invalid argument, seen
  // on the H200 for the fused norm backward at hidden 96, half precision).
  cudaFuncAttributes attrs{};
  RUDNN_CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernel));
  if (smem + attrs.sharedSizeBytes > kDefaultSmemLimit && !opted_in[{device, kernel}]) {
    // Raise the limit once to everything the device allows next to the kernel's static smem.
    const int optin = core::device_props(device).max_smem_per_block_optin;
    RUDNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          optin - int(attrs.sharedSizeBytes)));
    opted_in[{device, kernel}] = true;
  }
  int blocks = 0;
  RUDNN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, block, smem));
  cache.emplace(key, blocks);
  return blocks;
}

bool launch_row_cluster(const void* kernel, void* params, i64 rows, i64 chunks, int slots, cudaStream_t stream) {
  const int device = core::current_device();
  const core::DeviceProps& props = core::device_props(device);
  // Hopper only, as the library's other sm_90 paths: the cluster kernels exist as sm_90a code; any
  // other device runs the compute_80 PTX, where their bodies are traps.
  const int blocks = cluster_blocks(rows, chunks, props.sm_count, props.cc_major == 9, slots);
  if (blocks == 0) return false;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = unsigned(blocks);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(blocks), unsigned(std::min(rows, kern::kMaxGridY)), 1);
  config.blockDim = dim3(unsigned(kern::kClusterThreads), 1, 1);
  config.dynamicSmemBytes = kern::kClusterSmem;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  {
    // Whether the device can run such a cluster at all (once per device, kernel and size).
    using Key = std::tuple<int, const void*, int>;
    static std::mutex mutex;
    static std::map<Key, bool> fits;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = fits.find(Key{device, kernel, blocks});
    if (it == fits.end()) {
      // The code the device runs must come from sm_90 sources (a build without 90a has only the traps).
      cudaFuncAttributes attrs{};
      RUDNN_CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernel));
      int clusters = 0;
      if (attrs.ptxVersion >= 90) RUDNN_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
      it = fits.emplace(Key{device, kernel, blocks}, clusters > 0).first;
    }
    if (!it->second) return false;
  }
  void* args[] = {params};
  RUDNN_CUDA_CHECK(cudaLaunchKernelExC(&config, kernel, args));
  RUDNN_CUDA_CHECK_LAUNCH("a norm cluster kernel");
  return true;
}

void spread_rows(RowLaunch& launch, i64 rows, const void* kernel) {
  const int sm_count = core::device_props(core::current_device()).sm_count;
  spread_rows_over(launch, rows, i64(std::max(1, resident_blocks(kernel, launch.block, launch.smem))) * sm_count);
}

bool aligned16(const void* data) { return (reinterpret_cast<std::uintptr_t>(data) & 15u) == 0; }

bool rows_vectorizable(const void* data, const core::RowIndexer& rows, int vec) {
  if (!aligned16(data)) return false;
  for (int d = 0; d < rows.ndims; ++d)
    if (rows.strides[d] % vec != 0) return false;
  return true;
}

WgradPlan wgrad_plan(i64 rows, i64 hidden, int device) {
  const core::DeviceProps& props = core::device_props(device);
  return wgrad_plan(rows, hidden, props.sm_count, std::size_t(props.max_smem_per_block_optin));
}

}  // namespace rudnn::norm::plan
