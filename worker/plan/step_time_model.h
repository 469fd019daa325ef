// StepTimeModel: what one training step of a job would take on a cluster of
// GPUs, predicted from its memory plan and a few rates, for `pstar plan
// --scale`. Per rank and step: compute, the PCIe copies of chunks, the ZeRO
// collectives (ring all-gather and reduce-scatter, bandwidth and latency
// terms), the host's Adam and the disk tier; the step with collectives
// synchronous (runtime.comm_overlap false) and under compute (the larger of
// compute and communication, plus the chunk pipeline's ends), tokens/s, and
// the largest model of the job's width that fits each world size.
//
// The rates a step depends on most were measured on a GPU host and are
// cited (kMeasuredRates); the network's are modelled (NCCL-class bus
// bandwidths for NVLink and 400 Gbit/s links) and say so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/config/config.h"
#include "worker/core/status.h"

namespace pstar {

struct ClusterSpec {
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  double intra_node_gbytes_per_s = 370.0;   // per GPU, NVLink (modelled)
  double inter_node_gbits_per_s = 400.0;    // per GPU, the network (modelled)
  double link_efficiency = 0.9;             // of the inter-node line rate a ring achieves (modelled)
  double intra_latency_s = 3e-6;            // per ring hop
  double inter_latency_s = 10e-6;
  double compute_tflops = 0.0;              // 0: the measured rate of the compute device
  double pcie_gbytes_per_s = 0.0;           // each way; 0: measured
  double host_adam_params_per_s = 0.0;      // 0: measured
  double disk_gbytes_per_s = 2.0;           // the disk tier's read and write (modelled)
  int64_t gpu_memory_bytes = int64_t(80) << 30;  // per GPU
  int64_t host_memory_bytes = int64_t(256) << 30;  // per GPU's rank
  int64_t gpus() const { return nodes * gpus_per_node; }
};

// Checks the flags' values: bandwidths and rates positive, at most 1,048,576
// GPUs, whole nodes. One line naming the problem.
Status ValidateClusterSpec(const ClusterSpec& spec);

// The rates measured on a GPU host, with where.
struct MeasuredRate {
  const char* name;
  double value;
  const char* unit;
  const char* source;  // the bench/RESULTS.md section and row
};
const std::vector<MeasuredRate>& MeasuredRates();

// The value a flag gave `rate` (--tflops, --pcie-bw, --adam-rate), or 0
// where none did and the measured value applies.
double GivenRate(const ClusterSpec& spec, const MeasuredRate& rate);

struct StepPrediction {
  int64_t gpus = 0, nodes = 0;
  bool fits = false;            // the plan fits the GPU and host memory given
  std::string why_not;          // when it does not
  int64_t parameters = 0;
  double tokens_per_rank = 0;   // per step
  double compute_s = 0, pcie_s = 0, collective_s = 0, collective_latency_s = 0;
  double adam_s = 0, disk_s = 0;
  double gather_bytes = 0, scatter_bytes = 0;  // per rank per step
  double step_sync_s = 0;       // collectives synchronous (comm_overlap false)
  double pipeline_ends_s = 0;   // one chunk's gather and one's reduce-scatter, with nothing beside them
  double turn_s = 0;            // compute from the forward pass's last gather to the first final gradient (link idle)
  double step_overlap_s = 0;    // collectives, copies and Adam under compute
  double exposed_collective_s = 0;  // of the overlapped step
  double tokens_per_s = 0;      // with overlap
  int64_t largest_layers = 0;   // of the job's width, that fit this world size
  int64_t largest_parameters = 0;
  bool largest_capped = false;  // at the most layers a config takes (10000): at least that
};

// The step of `config` (a cuda job; batch per rank) on `gpus` GPUs of `spec`.
Result<StepPrediction> PredictStep(const Config& config, const ClusterSpec& spec, int64_t gpus);

// World sizes 1, 2, 4, ... up to spec.gpus(), and spec.gpus() itself.
Result<std::vector<StepPrediction>> PredictScaling(const Config& config, const ClusterSpec& spec);

std::string FormatScaling(const Config& config, const ClusterSpec& spec, const std::vector<StepPrediction>& rows);

}  // namespace pstar
