// The CUDA-on-CPU kernel interpreter: what a rewritten .cu file (rewrite.py) sees in place of
// the CUDA runtime and device headers. Every CUDA thread of a block is a fiber with its own stack;
// the blocks of a launch run one after another on the calling thread, the threads of a block in a
// chosen, seeded order (forward, reverse, random). A thread runs until it waits (__syncthreads, a
// warp collective) or returns; a wait completes when every thread it names has arrived. What a GPU
// would do wrong silently or hang on is an ablate::emu::Error naming the .cu line: a barrier some
// threads skip, a shuffle naming a lane that is not there, an invalid launch, a write past the end
// of a __shared__ array or of a device allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// --- the runtime's types -----------------------------------------------------------------------

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

namespace ablate::emu {

// A place in the (original) source: the rewritten file keeps the .cu's name and lines.
struct Where {
  const char* file;
  int line;
};

// Every fault the interpreter finds: the message names the .cu line, the kernel, the block and
// the schedule (so the run can be replayed with ABLATE_EMU_SCHEDULE).
class Error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// The order in which the threads of a block (and the blocks of a grid) take their turns.
enum class Order { forward, reverse, random };
struct Schedule {
  Order order = Order::forward;
  uint64_t seed = 0;         // random only
  std::string name() const;  // "forward", "reverse", "random:SEED"
};
// Parses a name as Schedule::name writes it; throws std::invalid_argument otherwise.
Schedule parse_schedule(const std::string& text);
void set_schedule(const Schedule& s);
Schedule current_schedule();
// The schedules a kernel test runs under: forward, reverse and two random seeds, or only the one
// ABLATE_EMU_SCHEDULE names (to replay a failure).
std::vector<Schedule> test_schedules();
// Sets the schedule for its lifetime, restoring the previous one after.
class ScopedSchedule {
 public:
  explicit ScopedSchedule(const Schedule& s) : saved_(current_schedule()) { set_schedule(s); }
  ~ScopedSchedule() { set_schedule(saved_); }
  ScopedSchedule(const ScopedSchedule&) = delete;
  ScopedSchedule& operator=(const ScopedSchedule&) = delete;

 private:
  Schedule saved_;
};

// Counters since the process started (the tests check that kernels ran at all).
struct Stats {
  uint64_t launches = 0, blocks = 0, threads = 0, barriers = 0, collectives = 0;
};
Stats stats();

namespace detail {

// What a running thread reads as threadIdx, blockIdx, blockDim and gridDim.
struct ThreadState {
  uint3 thread_idx{0, 0, 0}, block_idx{0, 0, 0};
  dim3 block_dim, grid_dim;
};
// Default visibility: plugins built with hidden visibility share the interpreter's one copy.
__attribute__((visibility("default"))) inline thread_local ThreadState* t_current __attribute__((tls_model("initial-exec"))) = nullptr;

// The scheduler sets t_current before each switch to a thread; a thread sanitizer must not count
// that as a race between the threads it schedules.
#if defined(__SANITIZE_THREAD__)
#define ABLATE_EMU_NO_TSAN __attribute__((no_sanitize_thread))
#else
#define ABLATE_EMU_NO_TSAN
#endif
ABLATE_EMU_NO_TSAN inline ThreadState& current(const char* what) {
  if (t_current == nullptr) throw Error(std::string(what) + " read outside a kernel");
  return *t_current;
}

// A __shared__ declaration: one per site (a static of the function that declares it).
struct SharedSite {
  const char* name;
  const char* file;
  int line;
  std::size_t bytes;
  std::size_t align;
};
void* shared_memory(const SharedSite& site);
void* dynamic_shared_memory(std::size_t align);

enum class Collective : int { shfl, shfl_up, shfl_down, shfl_xor, ballot, any, all, syncwarp };
// Waits for the lanes `mask` names; returns this lane's result (the source lane's value for a
// shuffle, the vote for ballot/any/all).
uint64_t warp_collective(Where w, Collective kind, unsigned mask, uint64_t value, int arg, int width);
// Barrier forms: plain (op 0), count (1), and (2), or (3).
int block_barrier(Where w, int op, int predicate);
inline int predicate(int p) { return p != 0 ? 1 : 0; }

struct LaunchConfig {
  dim3 grid, block;
  std::size_t shared = 0;
  void* stream = nullptr;
};
// Runs `body` as every thread of every block of the grid (blocking until done).
void run_grid(Where w, const char* kernel, const LaunchConfig& c, void (*body)(void*), void* ctx);
// True while the launch's stream captures (cudaStreamBeginCapture): the launch is then recorded
// into the graph (capture_grid, which checks it as a launch is checked) and runs when it does.
bool capturing(const void* stream);
void capture_grid(Where w, const char* kernel, const LaunchConfig& c, void (*body)(void*), std::shared_ptr<void> ctx);
// Work an emulated library does on the host in a stream's place (cub's sort): a node of the graph
// `stream` captures, run when the graph runs.
void capture_work(const void* stream, std::function<void()> work);
// The calling lane alone: the narrowest answer CUDA allows (it promises no convergence), so code
// that takes __activemask() for "the whole warp" fails here as it may on a GPU.
unsigned active_mask();

}  // namespace detail

template <class G, class B>
detail::LaunchConfig launch_config(G grid, B block, std::size_t shared = 0, void* stream = nullptr) {
  return {dim3(grid), dim3(block), shared, stream};
}
template <class G, class B, class S>
detail::LaunchConfig launch_config(G grid, B block, std::size_t shared, S* stream) {
  return {dim3(grid), dim3(block), shared, static_cast<void*>(stream)};
}

// kernel<<<cfg>>>(args...) as rewrite.py writes it: the arguments are evaluated once, copied as
// a launch copies them, and each thread calls the kernel with its own copies.
template <class F, class... A>
void launch(Where w, const char* kernel, const detail::LaunchConfig& c, F f, A&&... args) {
  struct Ctx {
    F f;
    std::tuple<std::decay_t<A>...> args;
  };
  void (*body)(void*) = [](void* p) {
    auto* x = static_cast<Ctx*>(p);
    std::apply([&](const auto&... a) { x->f(a...); }, x->args);
  };
  if (detail::capturing(c.stream)) {  // the graph keeps its own copy of the arguments
    detail::capture_grid(w, kernel, c, body, std::make_shared<Ctx>(Ctx{f, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)}));
    return;
  }
  Ctx ctx{f, std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)};
  detail::run_grid(w, kernel, c, body, &ctx);
}

template <class T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffles move values of up to 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

template <class T>
T shfl_sync(Where w, unsigned mask, T v, int src_lane, int width = 32) {
  return from_bits<T>(detail::warp_collective(w, detail::Collective::shfl, mask, to_bits(v), src_lane, width));
}
template <class T>
T shfl_up_sync(Where w, unsigned mask, T v, unsigned delta, int width = 32) {
  return from_bits<T>(detail::warp_collective(w, detail::Collective::shfl_up, mask, to_bits(v), int(delta), width));
}
template <class T>
T shfl_down_sync(Where w, unsigned mask, T v, unsigned delta, int width = 32) {
  return from_bits<T>(detail::warp_collective(w, detail::Collective::shfl_down, mask, to_bits(v), int(delta), width));
}
template <class T>
T shfl_xor_sync(Where w, unsigned mask, T v, int lane_mask, int width = 32) {
  return from_bits<T>(detail::warp_collective(w, detail::Collective::shfl_xor, mask, to_bits(v), lane_mask, width));
}
inline unsigned ballot_sync(Where w, unsigned mask, int p) {
  return unsigned(detail::warp_collective(w, detail::Collective::ballot, mask, detail::predicate(p), 0, 32));
}
inline int any_sync(Where w, unsigned mask, int p) {
  return int(detail::warp_collective(w, detail::Collective::any, mask, detail::predicate(p), 0, 32));
}
inline int all_sync(Where w, unsigned mask, int p) {
  return int(detail::warp_collective(w, detail::Collective::all, mask, detail::predicate(p), 0, 32));
}
inline void syncwarp(Where w, unsigned mask = 0xffffffffu) {
  (void)detail::warp_collective(w, detail::Collective::syncwarp, mask, 0, 0, 32);
}

}  // namespace ablate::emu

// --- what kernels see --------------------------------------------------------------------------

#define threadIdx (::ablate::emu::detail::current("threadIdx").thread_idx)
#define blockIdx (::ablate::emu::detail::current("blockIdx").block_idx)
#define blockDim (::ablate::emu::detail::current("blockDim").block_dim)
#define gridDim (::ablate::emu::detail::current("gridDim").grid_dim)
constexpr int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

#define ABLATE_EMU_WHERE (::ablate::emu::Where{__FILE__, __LINE__})
#define __syncthreads() ((void)::ablate::emu::detail::block_barrier(ABLATE_EMU_WHERE, 0, 1))
// The predicate is CUDA's int parameter: converted to int first (0.5f is 0), then tested.
#define __syncthreads_count(p) (::ablate::emu::detail::block_barrier(ABLATE_EMU_WHERE, 1, ::ablate::emu::detail::predicate(p)))
#define __syncthreads_and(p) (::ablate::emu::detail::block_barrier(ABLATE_EMU_WHERE, 2, ::ablate::emu::detail::predicate(p)))
#define __syncthreads_or(p) (::ablate::emu::detail::block_barrier(ABLATE_EMU_WHERE, 3, ::ablate::emu::detail::predicate(p)))
#define __shfl_sync(...) (::ablate::emu::shfl_sync(ABLATE_EMU_WHERE, __VA_ARGS__))
#define __shfl_up_sync(...) (::ablate::emu::shfl_up_sync(ABLATE_EMU_WHERE, __VA_ARGS__))
#define __shfl_down_sync(...) (::ablate::emu::shfl_down_sync(ABLATE_EMU_WHERE, __VA_ARGS__))
#define __shfl_xor_sync(...) (::ablate::emu::shfl_xor_sync(ABLATE_EMU_WHERE, __VA_ARGS__))
#define __ballot_sync(...) (::ablate::emu::ballot_sync(ABLATE_EMU_WHERE, __VA_ARGS__))
#define __any_sync(...) (::ablate::emu::any_sync(ABLATE_EMU_WHERE, __VA_ARGS__))
#define __all_sync(...) (::ablate::emu::all_sync(ABLATE_EMU_WHERE, __VA_ARGS__))
#define __syncwarp(...) (::ablate::emu::syncwarp(ABLATE_EMU_WHERE, ##__VA_ARGS__))
#define __activemask() (::ablate::emu::detail::active_mask())

// __shared__ declarations as rewrite.py writes them: block-wide storage, fresh and poisoned for
// every block, with a guard after it checked when the block ends.
#define ABLATE_EMU_SHARED(T, name, dims)                                                                                            \
  using name##_ablate_emu_t = T dims;                                                                                               \
  static constexpr ::ablate::emu::detail::SharedSite name##_ablate_emu_site{#name, __FILE__, __LINE__, sizeof(name##_ablate_emu_t), \
                                                                            alignof(name##_ablate_emu_t)};                          \
  name##_ablate_emu_t& name = *static_cast<name##_ablate_emu_t*>(::ablate::emu::detail::shared_memory(name##_ablate_emu_site))
#define ABLATE_EMU_SHARED_ALIGNED(T, name, dims, alignment)                                     \
  using name##_ablate_emu_t = T dims;                                                           \
  static constexpr ::ablate::emu::detail::SharedSite name##_ablate_emu_site{                    \
      #name, __FILE__, __LINE__, sizeof(name##_ablate_emu_t),                                   \
      alignof(name##_ablate_emu_t) > (alignment) ? alignof(name##_ablate_emu_t) : (alignment)}; \
  name##_ablate_emu_t& name = *static_cast<name##_ablate_emu_t*>(::ablate::emu::detail::shared_memory(name##_ablate_emu_site))
#define ABLATE_EMU_EXTERN_SHARED(T, name) T* name = static_cast<T*>(::ablate::emu::detail::dynamic_shared_memory(alignof(T)))

// --- device functions the kernels use ---------------------------------------------------------

#include <cmath>

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __expf(float a) { return std::exp(a); }
inline float __logf(float a) { return std::log(a); }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline float __saturatef(float a) { return !(a > 0.0f) ? 0.0f : (a > 1.0f ? 1.0f : a); }  // NaN -> 0, as .sat
inline unsigned __float_as_uint(float x) { return ::ablate::emu::from_bits<unsigned>(::ablate::emu::to_bits(x)); }
inline int __float_as_int(float x) { return ::ablate::emu::from_bits<int>(::ablate::emu::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return ::ablate::emu::from_bits<float>(::ablate::emu::to_bits(x)); }
inline float __int_as_float(int x) { return ::ablate::emu::from_bits<float>(::ablate::emu::to_bits(x)); }
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }

// Atomics: the compiler's atomic builtins, so a thread sanitizer sees them as atomic; float and
// double through a compare-and-swap on their bits.
namespace ablate::emu::detail {
template <class T>
using bits_t = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
template <class T, class F>
T atomic_update(T* p, F f) {  // *p = f(*p) atomically; returns the old value
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics on 4- or 8-byte values");
  auto* q = reinterpret_cast<bits_t<T>*>(p);
  bits_t<T> old = __atomic_load_n(q, __ATOMIC_RELAXED);
  for (;;) {
    T value;
    std::memcpy(&value, &old, sizeof(T));
    const T next = f(value);
    bits_t<T> next_bits;
    std::memcpy(&next_bits, &next, sizeof(T));
    if (__atomic_compare_exchange_n(q, &old, next_bits, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return value;
  }
}
}  // namespace ablate::emu::detail

template <class T>
inline T atomicAdd(T* p, T v) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
  } else {
    return ::ablate::emu::detail::atomic_update(p, [v](T x) { return T(x + v); });
  }
}
template <class T>
inline T atomicExch(T* p, T v) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
  } else {
    return ::ablate::emu::detail::atomic_update(p, [v](T) { return v; });
  }
}
template <class T>
inline T atomicCAS(T* p, T expected, T desired) {
  static_assert(std::is_integral_v<T>, "atomicCAS takes integers, as in CUDA");
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return expected;
}
template <class T>
inline T atomicMax(T* p, T v) {
  static_assert(std::is_integral_v<T>, "atomicMax takes integers, as in CUDA");
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
  static_assert(std::is_integral_v<T>, "atomicMin takes integers, as in CUDA");
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
