// `adamw8bit` on a CUDA device (registered for device "cuda"; built where CUDA is enabled): the
// state of adamw8bit_state.hpp in device memory, laid out as its host vectors, which are the
// staging copies save_state and load_state go through (a checkpoint is the same on either device).
// One kernel per step (adamw8bit_kernel.cu) on the model's stream does the CPU implementation's
// arithmetic, bit for bit. The count of skipped elements is copied after each step, on the stream,
// into pinned host memory, with an event behind it: it is read when asked (skipped_nonfinite) or
// at the start of the next step by waiting for that event alone, which the end of the step it
// belongs to has passed, so reading it never waits for the work queued since. The clip factor is
// read on the device where the engine formed it there (reads_device_scale).
#include <algorithm>
#include <string>
#include <vector>

#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "adamw8bit_kernel.hpp"
#include "adamw8bit_state.hpp"

namespace ablate::adamw8bit {
namespace {

class CudaAdamW8bit final : public AdamW8bitState {
 public:
  using AdamW8bitState::AdamW8bitState;

  void init(const ParamTable& table, DeviceType device) override {
    if (device != DeviceType::cuda) {
      throw_input_error("optimizer.name", "adamw8bit's CUDA implementation (registered for run.device = \"cuda\") was "
                                          "given another device");
    }
    if (h_.block_size > cuda::kMaxBlockSize) {
      throw_input_error("optimizer.adamw8bit.block_size", std::to_string(h_.block_size) +
                                                              " is above the CUDA kernel's largest block, " +
                                                              std::to_string(cuda::kMaxBlockSize));
    }
    plan(table);
    init_device(table);
  }

  void step(const ParamTable& table, TensorView params, TensorView grads, const StepArgs& args) override;

  // The kernel writes the bf16 copy as it stores each parameter.
  bool writes_bf16() const override { return true; }
  bool reads_device_scale() const override { return true; }

  ~CudaAdamW8bit() override {
    if (copied_ != nullptr) cudaEventDestroy(copied_);
    if (h_skipped_ != nullptr) cudaFreeHost(h_skipped_);
  }

  int64_t skipped_nonfinite() const override {
    collect_skipped();
    return skipped_;
  }

 private:
  void init_device(const ParamTable& table);
  void upload_state() override;
  void download_state() const override;
  void collect_skipped() const;

  mutable int64_t pending_step_ = 0;  // a step whose count is still on the device (0: none)
  cudaStream_t stream_ = nullptr;     // the queue of the last step
  ablate::cuda::DeviceBuffer<cuda::BlockInfo> d_blocks_;
  ablate::cuda::DeviceBuffer<uint8_t> d_m_codes_, d_v_codes_;
  ablate::cuda::DeviceBuffer<float> d_m_absmax_, d_v_absmax_, d_m_fp32_, d_v_fp32_;
  ablate::cuda::DeviceBuffer<float> d_m_values_, d_v_values_, d_m_thresholds_, d_v_thresholds_;
  ablate::cuda::DeviceBuffer<uint8_t> d_m_buckets_, d_v_buckets_;
  ablate::cuda::DeviceBuffer<unsigned long long> d_skipped_;
  unsigned long long* h_skipped_ = nullptr;  // pinned: the count of the last step, copied after it
  cudaEvent_t copied_ = nullptr;             // recorded behind that copy
};

// The step, enqueued on args.stream.
void CudaAdamW8bit::step(const ParamTable& table, TensorView params, TensorView grads, const StepArgs& args) {
  const Coefficients c = begin_step(table, params, grads, args);
  if (params.device != DeviceType::cuda || grads.device != DeviceType::cuda) {
    throw_runtime_error(kName, "initialised on a CUDA device but given host buffers");
  }
  collect_skipped();
  stream_ = args.stream.as<cudaStream_t>();
  cuda::StepArgs a;
  a.params = params.as<float>();
  a.grads = grads.as<float>();
  a.params_bf16 = static_cast<uint16_t*>(args.params_bf16);
  a.blocks = d_blocks_.data();
  a.num_blocks = int64_t(d_blocks_.size());
  a.m_codes = d_m_codes_.data();
  a.v_codes = d_v_codes_.data();
  a.m_absmax = d_m_absmax_.data();
  a.v_absmax = d_v_absmax_.data();
  a.m_fp32 = d_m_fp32_.data();
  a.v_fp32 = d_v_fp32_.data();
  a.m_map = {d_m_values_.data(), d_m_thresholds_.data(), d_m_buckets_.data(), signed_.zero_code()};
  a.v_map = {d_v_values_.data(), d_v_thresholds_.data(), d_v_buckets_.data(), unsigned_.zero_code()};
  a.c = c;
  a.grad_scale = args.grad_scale_device;
  a.skipped = d_skipped_.data();
  ABLATE_CUDA_CHECK(cudaMemsetAsync(d_skipped_.data(), 0, sizeof(unsigned long long), stream_));
  ABLATE_CUDA_CHECK(cuda::launch_step(a, stream_));
  ABLATE_CUDA_CHECK(cudaMemcpyAsync(h_skipped_, d_skipped_.data(), sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream_));
  ABLATE_CUDA_CHECK(cudaEventRecord(copied_, stream_));
  pending_step_ = args.step;
}

// Device state mirrors the host vectors' layout; one BlockInfo per work block.
void CudaAdamW8bit::init_device(const ParamTable& table) {
  std::vector<cuda::BlockInfo> blocks;
  blocks.reserve(std::size_t(blocks_));
  for (std::size_t si = 0; si < slices_.size(); ++si) {
    const SliceState& s = slices_[si];
    for (int64_t j0 = 0, b = 0; j0 < s.numel; j0 += h_.block_size, ++b) {
      cuda::BlockInfo info;
      info.param_offset = s.param_offset + j0;
      info.state_offset = s.state_offset + j0;
      info.absmax_index = int32_t(s.quantized ? s.absmax_offset + b : 0);
      info.n = int32_t(std::min(h_.block_size, s.numel - j0));
      info.quantized = s.quantized ? 1 : 0;
      info.decay = table.slices[si].decay ? 1 : 0;
      blocks.push_back(info);
    }
  }
  d_blocks_.upload(blocks.data(), blocks.size());
  d_m_values_.upload(signed_.values().data(), signed_.values().size());
  d_v_values_.upload(unsigned_.values().data(), unsigned_.values().size());
  d_m_thresholds_.upload(signed_.thresholds().data(), signed_.thresholds().size());
  d_v_thresholds_.upload(unsigned_.thresholds().data(), unsigned_.thresholds().size());
  d_m_buckets_.upload(signed_.bucket_first().data(), signed_.bucket_first().size());
  d_v_buckets_.upload(unsigned_.bucket_first().data(), unsigned_.bucket_first().size());
  d_skipped_.resize(1);
  if (h_skipped_ == nullptr) ABLATE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&h_skipped_), sizeof(unsigned long long)));
  if (copied_ == nullptr) ABLATE_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  upload_state();
}

void CudaAdamW8bit::upload_state() {
  // The copies run on the legacy default stream, which the model's non-blocking stream does not
  // order: a step still queued there reads and writes this state, so it finishes first.
  ABLATE_CUDA_CHECK(cudaDeviceSynchronize());
  d_m_codes_.upload(m_codes_.data(), m_codes_.size());
  d_v_codes_.upload(v_codes_.data(), v_codes_.size());
  d_m_absmax_.upload(m_absmax_.data(), m_absmax_.size());
  d_v_absmax_.upload(v_absmax_.data(), v_absmax_.size());
  d_m_fp32_.upload(m_fp32_.data(), m_fp32_.size());
  d_v_fp32_.upload(v_fp32_.data(), v_fp32_.size());
  // Those copies ran on the legacy default stream, which does not order the model's non-blocking one.
  ABLATE_CUDA_CHECK(cudaDeviceSynchronize());
}

// The host vectors are the staging copies of the device state (refreshed for save_state).
void CudaAdamW8bit::download_state() const {
  collect_skipped();  // waits for the last step on its stream
  d_m_codes_.download(m_codes_.data());
  d_v_codes_.download(v_codes_.data());
  d_m_absmax_.download(m_absmax_.data());
  d_v_absmax_.download(v_absmax_.data());
  d_m_fp32_.download(m_fp32_.data());
  d_v_fp32_.download(v_fp32_.data());
}

// Reads the count of the last enqueued step (waiting for that step, not for what came after it)
// and warns when it is not 0.
void CudaAdamW8bit::collect_skipped() const {
  if (pending_step_ == 0) return;
  ABLATE_CUDA_CHECK(cudaEventSynchronize(copied_));
  skipped_ = int64_t(*h_skipped_);
  warn_skipped(pending_step_, skipped_);
  pending_step_ = 0;
}

}  // namespace

std::unique_ptr<Optimizer> make_cuda(Hyper h) { return std::make_unique<CudaAdamW8bit>(std::move(h)); }

}  // namespace ablate::adamw8bit
