// The device seam's shared parts (buffers, batch packing) and the `cpu` device (see device.hpp).
#include "ablate/device.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "ablate/device_math.hpp"
#include "ablate/nf4.hpp"
#include "ablate/error.hpp"
#include "host_memory.hpp"
#include "ablate/runtime/defaults.hpp"

namespace ablate {

Device::~Device() = default;

void Device::begin_capture() {
  throw_runtime_error("device", describe() + " has no queue to capture work from (capabilities().step_capture is false)");
}
std::unique_ptr<CapturedWork> Device::end_capture() {
  throw_runtime_error("device", describe() + " has no queue to capture work from (capabilities().step_capture is false)");
}

namespace {

// Throws unless v is one element of `dtype` on `device`: the scalars of the *_to reductions.
void check_scalar(const TensorView& v, DType dtype, DeviceType device, const char* what) {
  if (v.data == nullptr || v.numel() != 1 || v.dtype != dtype || v.device != device) {
    throw_runtime_error("device",
                        std::string(what) + " needs one " + to_string(dtype) + " value on the " + to_string(device) + " device");
  }
}

}  // namespace

void Device::masked_loss_sum_to(TensorView losses, TensorView targets, TensorView out, bool add) {
  check_scalar(out, DType::f64, type(), "masked_loss_sum_to");
  double v = masked_loss_sum(losses, targets);
  if (add) {
    double before = 0;
    download(&before, out);
    v = before + v;
  }
  upload(out, &v);
}

void Device::squared_norm_to(TensorView x, TensorView out) {
  check_scalar(out, DType::f64, type(), "squared_norm_to");
  const double v = squared_norm(x);
  upload(out, &v);
}

void Device::clip_factor_to(TensorView squared_norm, double clip, TensorView factor) {
  check_scalar(squared_norm, DType::f64, type(), "clip_factor_to");
  check_scalar(factor, DType::f32, type(), "clip_factor_to");
  double sq = 0;
  download(&sq, squared_norm);
  const float f = device_math::clip_factor(std::sqrt(sq), clip);
  upload(factor, &f);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (device_ != nullptr && data_ != nullptr) device_->release(data_);
    device_ = std::exchange(o.device_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    dtype_ = o.dtype_;
    count_ = std::exchange(o.count_, 0);
  }
  return *this;
}

Buffer::~Buffer() {
  if (device_ != nullptr && data_ != nullptr) device_->release(data_);
}

TensorView Buffer::view() const noexcept { return view(0, count_); }

TensorView Buffer::view(int64_t offset, int64_t n) const noexcept {
  auto* p = static_cast<unsigned char*>(data_) + offset * int64_t(dtype_size(dtype_));
  return flat_view(p, dtype_, n, device_ != nullptr ? device_->type() : DeviceType::cpu);
}

// ---- batches ----

namespace {

TensorView i32_view(int32_t* p, int64_t d0, int64_t d1, DeviceType device) {
  TensorView t = flat_view(p, DType::i32, d0, device);
  if (d1 > 0) {
    t.ndim = 2;
    t.shape[1] = d1;
  }
  return t;
}

static_assert(sizeof(Segment) == 2 * sizeof(int32_t), "a Segment is read as an (S, 2) i32 array");

}  // namespace

void pack_batch(const Batch& b, std::vector<int32_t>& staging) {
  const std::size_t n = std::size_t(b.positions_total());
  staging.resize(4 * n + 2 * b.segments.size() + b.row_segments.size());
  int32_t* p = staging.data();
  for (const std::vector<int32_t>* v : {&b.tokens, &b.targets, &b.positions, &b.segment_ids}) {
    std::memcpy(p, v->data(), n * sizeof(int32_t));
    p += n;
  }
  if (!b.segments.empty()) std::memcpy(p, b.segments.data(), b.segments.size() * sizeof(Segment));
  p += 2 * b.segments.size();
  if (!b.row_segments.empty()) std::memcpy(p, b.row_segments.data(), b.row_segments.size() * sizeof(int32_t));
}

BatchViews batch_views_at(const Batch& b, int32_t* base, DeviceType device) {
  const int64_t n = b.positions_total(), s = int64_t(b.segments.size());
  BatchViews v;
  v.rows = b.rows;
  v.seq_len = b.seq_len;
  v.num_segments = int32_t(s);
  v.host = &b;
  v.device = device;
  v.tokens = i32_view(base, b.rows, b.seq_len, device);
  v.targets = i32_view(base + n, b.rows, b.seq_len, device);
  v.positions = i32_view(base + 2 * n, b.rows, b.seq_len, device);
  v.segment_ids = i32_view(base + 3 * n, b.rows, b.seq_len, device);
  v.segments = i32_view(base + 4 * n, s, 2, device);
  v.row_segments = i32_view(base + 4 * n + 2 * s, int64_t(b.row_segments.size()), 0, device);
  return v;
}

BatchViews host_batch_views(const Batch& b) {
  auto mut = [](const std::vector<int32_t>& v) { return const_cast<int32_t*>(v.data()); };
  BatchViews v;
  v.rows = b.rows;
  v.seq_len = b.seq_len;
  v.num_segments = int32_t(b.segments.size());
  v.host = &b;
  v.device = DeviceType::cpu;
  v.tokens = i32_view(mut(b.tokens), b.rows, b.seq_len, DeviceType::cpu);
  v.targets = i32_view(mut(b.targets), b.rows, b.seq_len, DeviceType::cpu);
  v.positions = i32_view(mut(b.positions), b.rows, b.seq_len, DeviceType::cpu);
  v.segment_ids = i32_view(mut(b.segment_ids), b.rows, b.seq_len, DeviceType::cpu);
  v.segments = i32_view(reinterpret_cast<int32_t*>(const_cast<Segment*>(b.segments.data())), v.num_segments, 2, DeviceType::cpu);
  v.row_segments = i32_view(mut(b.row_segments), int64_t(b.row_segments.size()), 0, DeviceType::cpu);
  return v;
}

// ---- the cpu device ----

namespace {

// The lower of the machine's memory and the process's limits, with the name of the one that binds.
std::pair<int64_t, const char*> host_memory_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  std::pair<int64_t, const char*> out{pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) : 0, "physical memory"};
  for (auto [resource, name] : {std::pair<int, const char*>{RLIMIT_AS, "the address-space limit (ulimit -v)"},
                                {RLIMIT_DATA, "the data-segment limit (ulimit -d)"}}) {
    rlimit l{};
    if (getrlimit(resource, &l) != 0 || l.rlim_cur == RLIM_INFINITY || l.rlim_cur > rlim_t(INT64_MAX)) continue;
    if (out.first == 0 || int64_t(l.rlim_cur) < out.first) out = {int64_t(l.rlim_cur), name};
  }
  return out;
}

}  // namespace

int64_t physical_memory_bytes() { return host_memory_limit().first; }
const char* physical_memory_source() { return host_memory_limit().second; }

namespace {

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

int64_t view_bytes(const TensorView& t) { return t.numel() * int64_t(dtype_size(t.dtype)); }

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int threads) : threads_(threads) {}
  ~CpuDevice() override = default;

  DeviceType type() const noexcept override { return DeviceType::cpu; }
  DeviceCapabilities capabilities() const override {  // host memory, fp32 products, mpi
    DeviceCapabilities c;
    c.collective = defaults::host_collective;
    return c;
  }
  std::string describe() const override { return "cpu (" + std::to_string(threads_) + " threads)"; }

  Buffer alloc(DType dtype, int64_t count) override {
    if (count <= 0) return {};
    const std::size_t bytes = std::size_t(count) * dtype_size(dtype);
    const std::size_t rounded = (bytes + kPrefix + 63) / 64 * 64;
    void* raw = std::aligned_alloc(64, rounded);
    if (raw == nullptr) {
      throw_runtime_error("cpu", "cannot allocate " + std::to_string(bytes) + " bytes (" + std::to_string(in_use_.load()) +
                                     " already in use through this device)");
    }
    // The size travels in front of the data (kept 64-byte aligned) so release() can count it.
    static_cast<Header*>(raw)->bytes = int64_t(rounded);
    void* data = static_cast<unsigned char*>(raw) + kPrefix;
    std::memset(data, 0, bytes);
    in_use_.fetch_add(int64_t(rounded));
    return Buffer(this, data, dtype, count);
  }

  void release(void* data) noexcept override {
    auto* raw = static_cast<unsigned char*>(data) - kPrefix;
    in_use_.fetch_sub(reinterpret_cast<Header*>(raw)->bytes);
    std::free(raw);
  }

  int64_t memory_in_use() const override { return in_use_.load(); }
  // The host is the device: the process's peak resident set, which is what can run out.
  int64_t memory_peak() const override { return peak_rss_bytes(); }
  int64_t memory_capacity() const override { return physical_memory_bytes(); }

  void upload(TensorView dst, const void* host) override { std::memcpy(dst.data, host, std::size_t(view_bytes(dst))); }
  void download(void* host, TensorView src) override { std::memcpy(host, src.data, std::size_t(view_bytes(src))); }
  void upload_batch(const Batch& batch, DeviceBatch& out) override { out.views = host_batch_views(batch); }

  void fill(TensorView x, float value) override {
    float* p = x.as<float>();
    std::fill(p, p + x.numel(), value);
  }

  // Summed in double in a fixed order per thread count.
  double squared_norm(TensorView x) override {
    const float* g = x.as<float>();
    const int64_t n = x.numel();
    double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (int64_t i = 0; i < n; ++i) sum += device_math::square_term(g[i]);
    return sum;
  }

  void scale(TensorView x, float factor) override {
    float* g = x.as<float>();
    const int64_t n = x.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) g[i] = device_math::scaled(g[i], factor);
  }

  double masked_loss_sum(TensorView losses, TensorView targets) override {
    const float* l = losses.as<float>();
    const int32_t* t = targets.as<int32_t>();
    const int64_t n = targets.numel();
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += device_math::masked_loss_term(l[i], t[i]);
    return sum;
  }

  void to_bf16(TensorView dst, TensorView src) override {
    check_to_bf16(dst, src, DeviceType::cpu);
    const float* x = src.as<float>();
    auto* y = static_cast<uint16_t*>(dst.data);
    const int64_t n = src.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = device_math::bf16_bits(x[i]);
  }

  void dequantize_nf4(TensorView dst, TensorView codes, TensorView absmax) override {
    check_dequantize_nf4(dst, codes, absmax, DeviceType::cpu);
    float* y = dst.as<float>();
    const auto* c = static_cast<const uint8_t*>(codes.data);
    const float* m = absmax.as<const float>();
    const int64_t n = dst.numel();
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; ++i) y[i] = nf4::value(c, m, i);
  }

  void copy(TensorView dst, TensorView src) override {
    check_copy(dst, src, DeviceType::cpu);
    std::memcpy(dst.data, src.data, std::size_t(view_bytes(src)));
  }

  void synchronize() override {}
  double peak_tflops(DType) const override { return 0.0; }

 private:
  struct Header {
    int64_t bytes;
  };
  static constexpr std::size_t kPrefix = 64;
  static_assert(sizeof(Header) <= kPrefix);
  int threads_;
  std::atomic<int64_t> in_use_{0};
};

}  // namespace

void check_dequantize_nf4(const TensorView& dst, const TensorView& codes, const TensorView& absmax, DeviceType device) {
  const int64_t n = dst.numel();
  if (dst.dtype != DType::f32 || codes.dtype != DType::u8 || absmax.dtype != DType::f32 || codes.numel() != nf4::code_bytes(n) ||
      absmax.numel() != nf4::blocks(n) || dst.device != device || codes.device != device || absmax.device != device) {
    throw_runtime_error(
        std::string(to_string(device)) + " device",
        "dequantize_nf4 needs an f32 output of n values, u8 codes of ceil(n/2) and f32 scales of ceil(n/64), all on the device");
  }
}

void check_copy(const TensorView& dst, const TensorView& src, DeviceType device) {
  if (dst.dtype != src.dtype || dst.numel() != src.numel() || dst.device != device || src.device != device) {
    throw_runtime_error(std::string(to_string(device)) + " device",
                        "copy needs two views of as many elements of one dtype on the device");
  }
}

void check_to_bf16(const TensorView& dst, const TensorView& src, DeviceType device) {
  if (dst.dtype != DType::bf16 || src.dtype != DType::f32 || dst.numel() != src.numel() || dst.device != device ||
      src.device != device) {
    throw_runtime_error(std::string(to_string(device)) + " device",
                        "to_bf16 needs a bf16 destination and an f32 source of as many elements on the device; got " +
                            std::string(to_string(dst.dtype)) + " (" + std::to_string(dst.numel()) + ") and " + to_string(src.dtype) +
                            " (" + std::to_string(src.numel()) + ")");
  }
}

ComponentInfo cpu_device_info() {
  ComponentInfo info;
  info.kind = Kind::device;
  info.name = "cpu";
  info.version = "1.0.0";
  info.doc = "host memory and OpenMP loops; batches are viewed in place";
  info.devices = {"cpu"};
  info.factory = [](const ComponentArgs& args) -> std::unique_ptr<Component> {
    return std::make_unique<CpuDevice>(args.run.threads > 0 ? args.run.threads
                                                            : int(std::max(1u, std::thread::hardware_concurrency())));
  };
  return info;
}

}  // namespace ablate
