// The kernel interpreter's engine (ablate_emu/emu.hpp): fibers on guarded stacks switched by
// switch_x86_64.S, the block scheduler with its barrier and warp-collective bookkeeping, __shared__
// storage and launch checks (the runtime calls of cuda_runtime.h are runtime.cpp's).
#include "ablate_emu/emu.hpp"

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>

#include "runtime_internal.hpp"  // also says whether this is an AddressSanitizer build (ABLATE_EMU_ASAN)

// ThreadSanitizer: this file is built without its instrumentation (the interpreter's own
// bookkeeping is shared by every fiber by design) and with ABLATE_EMU_TSAN defined, so that it
// tells TSan about the fibers and the synchronisation a barrier or collective gives.
#ifdef ABLATE_EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef ABLATE_EMU_TSAN
#include <sanitizer/tsan_interface.h>
#endif

// The sanitizers' options for every emu test program: the interpreter's statics (and the plugins'
// scratch, freed by the driver at exit on a GPU) are not leaks; a report ends the program.
#ifdef ABLATE_EMU_ASAN
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
extern "C" const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }
#endif
#ifdef ABLATE_EMU_TSAN
// The CPU references' OpenMP (libgomp, not instrumented) synchronises where TSan cannot see it.
extern "C" const char* __tsan_default_options() { return "halt_on_error=1:ignore_noninstrumented_modules=1"; }
#endif

extern "C" void ablate_emu_switch(void** save_sp, void* load_sp);
extern "C" void ablate_emu_trampoline();

namespace ablate::emu {
namespace {

#if defined(ABLATE_EMU_ASAN) || defined(ABLATE_EMU_TSAN)
constexpr std::size_t kStackBytes = std::size_t(512) << 10;  // sanitizers' frames are larger
#else
constexpr std::size_t kStackBytes = std::size_t(128) << 10;
#endif
constexpr std::size_t kStackGuard = std::size_t(64) << 10;  // below each stack: a frame jumping one page still faults
constexpr int kMaxThreads = 1024;
constexpr std::size_t kSharedLimit = 48 * 1024;  // per block, without cudaFuncSetAttribute

std::string hex(unsigned v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}
std::string at(Where w) { return std::string(w.file) + ":" + std::to_string(w.line); }
std::string lanes_of(unsigned mask) {
  std::string s;
  for (int l = 0; l < 32; ++l) {
    if (((mask >> l) & 1u) == 0) continue;
    int e = l;
    while (e + 1 < 32 && ((mask >> (e + 1)) & 1u)) ++e;
    if (!s.empty()) s += ",";
    s += e == l ? std::to_string(l) : std::to_string(l) + "-" + std::to_string(e);
    l = e;
  }
  return s;
}
const char* collective_name(detail::Collective k) {
  switch (k) {
    case detail::Collective::shfl: return "__shfl_sync";
    case detail::Collective::shfl_up: return "__shfl_up_sync";
    case detail::Collective::shfl_down: return "__shfl_down_sync";
    case detail::Collective::shfl_xor: return "__shfl_xor_sync";
    case detail::Collective::ballot: return "__ballot_sync";
    case detail::Collective::any: return "__any_sync";
    case detail::Collective::all: return "__all_sync";
    case detail::Collective::syncwarp: return "__syncwarp";
  }
  return "?";
}
const char* barrier_name(int op) {
  static const char* names[] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or"};
  return names[op];
}

// --- schedule and counters ---------------------------------------------------------------------

std::mutex g_schedule_mu;
Schedule g_schedule;
uint64_t g_schedule_epoch = 0;  // bumped by set_schedule: engines reseed their generators

std::atomic<uint64_t> g_launches{0}, g_blocks{0}, g_threads{0}, g_barriers{0}, g_collectives{0};

// --- fibers ------------------------------------------------------------------------------------

enum class State { ready, barrier, collective, exited };

struct Fiber {
  detail::ThreadState ts;
  void* sp = nullptr;
  char* stack = nullptr;  // the usable stack (a guard region below it)
  bool dirty = false;     // abandoned mid-run: its stack's shadow is unpoisoned before reuse
  int linear = 0;
  State state = State::ready;
  Where where{"", 0};
  int op = 0, pred = 0;  // barrier
  detail::Collective kind = detail::Collective::shfl;
  unsigned mask = 0;
  uint64_t value = 0, result = 0;
  int arg = 0, width = 32;
  void* asan_fake = nullptr;
  void* tsan = nullptr;
};

struct SharedAlloc {
  const detail::SharedSite* site;  // null: the dynamic (extern) array
  char* data;
  std::size_t bytes;
};

struct Launch {
  Where where{"", 0};
  const char* kernel = "";
  detail::LaunchConfig cfg;
  void (*body)(void*) = nullptr;
  void* ctx = nullptr;
  uint3 block{0, 0, 0};
  int threads = 0;
  std::vector<SharedAlloc> shared;
  std::size_t static_shared = 0;
  std::string error;  // the first fault of the running block
  char tsan_start = 0, tsan_end = 0, tsan_barrier = 0;
  char tsan_warp[32] = {};
  // Per warp of the running block, a bit per lane: waiting at a collective, and returned. They
  // mirror the fibers' states so that a lane's arrival is checked in a few instructions.
  unsigned waiting[32] = {}, exited[32] = {};
};

struct Engine {
  std::vector<Fiber> fibers = std::vector<Fiber>(kMaxThreads);
  void* sched_sp = nullptr;
  Fiber* current = nullptr;
  Launch* launch = nullptr;
  const void* sched_bottom = nullptr;
  std::size_t sched_size = 0;
  void* sched_fake = nullptr;
  void* sched_tsan = nullptr;
  std::mt19937_64 rng;
  uint64_t epoch = ~uint64_t(0);
  // The running block's round: its threads in this round's order, and the next place in it.
  std::vector<int> order;
  std::size_t next = 0;

  ~Engine() {
    for (Fiber& f : fibers) {
      if (f.stack != nullptr) munmap(f.stack - kStackGuard, kStackBytes + kStackGuard);
#ifdef ABLATE_EMU_TSAN
      if (f.tsan != nullptr) __tsan_destroy_fiber(f.tsan);
#endif
    }
  }
};

thread_local std::unique_ptr<Engine> t_engine __attribute__((tls_model("initial-exec")));

Engine& engine() {
  if (!t_engine) t_engine = std::make_unique<Engine>();
  return *t_engine;
}

[[noreturn]] void fail(const std::string& what) { throw Error(what); }

Fiber& running(Engine& e, const char* what) {
  if (e.current == nullptr) fail(std::string(what) + " called outside a kernel");
  return *e.current;
}

// The next thread of the round that is ready to run, taken from the round; null at its end.
Fiber* next_in_round(Engine& e) {
  while (e.next < e.order.size()) {
    Fiber& n = e.fibers[std::size_t(e.order[e.next++])];
    if (n.state == State::ready) return &n;
  }
  return nullptr;
}

// Fiber -> the round's next ready thread directly, where the scheduler would resume that one next
// anyway: half the switches of going through it. Under a sanitizer (which is told of every switch
// from and to the scheduler's stack), and when a thread has failed, always to the scheduler.
bool hand_off(Engine& e, Fiber& f) {
#if defined(ABLATE_EMU_ASAN) || defined(ABLATE_EMU_TSAN)
  (void)e;
  (void)f;
  return false;
#else
  if (!e.launch->error.empty()) return false;
  Fiber* n = next_in_round(e);
  if (n == nullptr) return false;
  e.current = n;
  detail::t_current = &n->ts;
  ablate_emu_switch(&f.sp, n->sp);
  return true;
#endif
}

// Fiber -> scheduler (or the round's next thread).
void yield_to_scheduler(Engine& e, Fiber& f) {
  if (hand_off(e, f)) return;
#ifdef ABLATE_EMU_ASAN
  __sanitizer_start_switch_fiber(&f.asan_fake, e.sched_bottom, e.sched_size);
#endif
#ifdef ABLATE_EMU_TSAN
  __tsan_switch_to_fiber(e.sched_tsan, __tsan_switch_to_fiber_no_sync);
#endif
  ablate_emu_switch(&f.sp, e.sched_sp);
#ifdef ABLATE_EMU_ASAN
  __sanitizer_finish_switch_fiber(f.asan_fake, &e.sched_bottom, &e.sched_size);
#endif
}

void tsan_release(void* a) {
#ifdef ABLATE_EMU_TSAN
  __tsan_release(a);
#else
  (void)a;
#endif
}
void tsan_acquire(void* a) {
#ifdef ABLATE_EMU_TSAN
  __tsan_acquire(a);
#else
  (void)a;
#endif
}

// The interpreter's own work done while a fiber runs (its shared-memory bookkeeping), counted by
// a thread sanitizer as the scheduler's, which owns that memory.
class AsScheduler {
 public:
#ifdef ABLATE_EMU_TSAN
  explicit AsScheduler(Engine& e) : fiber_(__tsan_get_current_fiber()) {
    __tsan_switch_to_fiber(e.sched_tsan, __tsan_switch_to_fiber_no_sync);
  }
  ~AsScheduler() { __tsan_switch_to_fiber(fiber_, __tsan_switch_to_fiber_no_sync); }

 private:
  void* fiber_;
#else
  explicit AsScheduler(Engine&) {}
#endif
};

bool is_vote(detail::Collective k) {
  return k == detail::Collective::ballot || k == detail::Collective::any || k == detail::Collective::all ||
         k == detail::Collective::syncwarp;
}

// The lanes of a warp that exist (a block's last warp may be partial) and that have returned.
unsigned existing_lanes(const Launch& L, int warp) {
  const int lanes = std::min(32, L.threads - warp * 32);
  return lanes == 32 ? ~0u : ((1u << lanes) - 1u);
}
unsigned returned_lanes(const Launch& L, int warp) { return L.exited[warp] & existing_lanes(L, warp); }

// A fiber's state, and the warp's bits that mirror it.
void set_state(Launch& L, Fiber& f, State s) {
  const unsigned bit = 1u << (f.linear % 32);
  const int warp = f.linear / 32;
  L.waiting[warp] = s == State::collective ? L.waiting[warp] | bit : L.waiting[warp] & ~bit;
  if (s == State::exited) L.exited[warp] |= bit;
  f.state = s;
}

bool complete_collective(Engine& e, Launch& L, int warp, const Fiber& arrived);

// Every thread's last act: a shuffle waiting for it can never complete (an error); a vote or
// __syncwarp waiting for it goes on without it, as CUDA counts only the lanes that have not exited.
void check_exit(Engine& e, Fiber& f) {
  Launch& L = *e.launch;
  const int warp = f.linear / 32, lane = f.linear % 32;
  for (int l = 0; l < 32; ++l) {
    if (((L.waiting[warp] >> l) & 1u) == 0) continue;
    const Fiber& o = e.fibers[std::size_t(warp * 32 + l)];
    if (o.state != State::collective || ((o.mask >> lane) & 1u) == 0) continue;
    if (!is_vote(o.kind)) {
      fail("thread " + std::to_string(f.linear) + " (warp " + std::to_string(warp) + " lane " + std::to_string(lane) +
           ") returned while lane " + std::to_string(l) + " waits for it at " + collective_name(o.kind) + " (" + at(o.where) +
           ", mask " + hex(o.mask) + ")");
    }
    complete_collective(e, L, warp, o);
  }
}

void fiber_main(Fiber* f) {
  Engine& e = engine();
#ifdef ABLATE_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &e.sched_bottom, &e.sched_size);
#endif
  Launch& L = *e.launch;
  tsan_acquire(&L.tsan_start);
  try {
    L.body(L.ctx);
    set_state(L, *f, State::exited);
    check_exit(e, *f);
  } catch (const std::exception& x) {
    if (L.error.empty()) L.error = x.what();
  } catch (...) {
    if (L.error.empty()) L.error = "a kernel thread threw something not a std::exception";
  }
  set_state(L, *f, State::exited);
  tsan_release(&L.tsan_end);
#ifdef ABLATE_EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, e.sched_bottom, e.sched_size);
#endif
#ifdef ABLATE_EMU_TSAN
  __tsan_switch_to_fiber(e.sched_tsan, __tsan_switch_to_fiber_no_sync);
#endif
  if (!hand_off(e, *f)) ablate_emu_switch(&f->sp, e.sched_sp);
  __builtin_unreachable();
}

// `index`: the thread's place in its block. Each stack's top is offset by a multiple of a cache
// line (16 KiB apart at most): stacks a whole number of pages apart would otherwise put every
// fiber's live frames in the same few cache sets, and a barrier walks them all.
void prepare(Fiber& f, int index) {
  if (f.stack == nullptr) {
    void* m = mmap(nullptr, kStackBytes + kStackGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    mprotect(m, kStackGuard, PROT_NONE);  // a stack overflow faults here instead of writing elsewhere
    f.stack = static_cast<char*>(m) + kStackGuard;
#ifdef ABLATE_EMU_TSAN
    f.tsan = __tsan_create_fiber(0);
#endif
  }
#ifdef ABLATE_EMU_ASAN
  if (f.dirty) ASAN_UNPOISON_MEMORY_REGION(f.stack, kStackBytes);
#endif
  f.dirty = false;
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  const std::size_t colour = std::size_t(index % 256) * 64;
  auto* s = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(f.stack + kStackBytes - colour) & ~uintptr_t(15));
  s[-1] = 0;
  s[-2] = reinterpret_cast<uint64_t>(&ablate_emu_trampoline);
  s[-3] = 0;                                          // rbp
  s[-4] = 0;                                          // rbx
  s[-5] = reinterpret_cast<uint64_t>(&f);             // r12: the argument
  s[-6] = reinterpret_cast<uint64_t>(&fiber_main);    // r13: the entry
  s[-7] = 0;                                          // r14
  s[-8] = 0;                                          // r15
  s[-9] = uint64_t(mxcsr) | (uint64_t(fpucw) << 32);  // MXCSR, x87 control word
  f.sp = &s[-9];
  f.state = State::ready;
  f.asan_fake = nullptr;
}

// Scheduler -> fiber, until it waits or returns.
void resume(Engine& e, Fiber& f) {
  e.current = &f;
  detail::t_current = &f.ts;
#ifdef ABLATE_EMU_ASAN
  __sanitizer_start_switch_fiber(&e.sched_fake, f.stack, kStackBytes);
#endif
#ifdef ABLATE_EMU_TSAN
  __tsan_switch_to_fiber(f.tsan, __tsan_switch_to_fiber_no_sync);
#endif
  ablate_emu_switch(&e.sched_sp, f.sp);
#ifdef ABLATE_EMU_ASAN
  __sanitizer_finish_switch_fiber(e.sched_fake, nullptr, nullptr);
#endif
  e.current = nullptr;
  detail::t_current = nullptr;
}

// --- shared memory -----------------------------------------------------------------------------

char* allocate_guarded(std::size_t bytes, std::size_t align) {
  const std::size_t a = std::max<std::size_t>(align, 256);
  const std::size_t total = (bytes + runtime::kGuard + a - 1) / a * a;
  auto* p = static_cast<char*>(std::aligned_alloc(a, total));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, runtime::kPoison, bytes + runtime::kGuard);
#ifdef ABLATE_EMU_ASAN
  ASAN_POISON_MEMORY_REGION(p + bytes, runtime::kGuard);
#endif
  return p;
}
void free_guarded(char* p, std::size_t bytes) {
#ifdef ABLATE_EMU_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p + bytes, runtime::kGuard);
#else
  (void)bytes;
#endif
  std::free(p);
}

std::string block_name(const uint3& b) {
  return "(" + std::to_string(b.x) + "," + std::to_string(b.y) + "," + std::to_string(b.z) + ")";
}

// The block's shared arrays: guards checked, memory freed. Returns the first overrun found.
std::string release_shared(Launch& L) {
  std::string err;
  for (SharedAlloc& a : L.shared) {
    if (err.empty() && !runtime::guard_intact(a.data, a.bytes)) {
      err = a.site != nullptr
                ? "a write past the end of __shared__ '" + std::string(a.site->name) + "' (" + a.site->file + ":" +
                      std::to_string(a.site->line) + ", " + std::to_string(a.site->bytes) + " bytes)"
                : "a write past the end of the dynamic (extern) __shared__ array (" + std::to_string(a.bytes) + " bytes)";
    }
    free_guarded(a.data, a.bytes);
  }
  L.shared.clear();
  L.static_shared = 0;
  return err;
}

// --- the block scheduler -----------------------------------------------------------------------

void order_for(Engine& e, std::vector<int>& order, Order o) {
  std::iota(order.begin(), order.end(), 0);
  if (o == Order::reverse) std::reverse(order.begin(), order.end());
  if (o == Order::random) std::shuffle(order.begin(), order.end(), e.rng);
}

// When no thread can run: release a barrier every live thread waits at, or describe the hang.
// Returns false when every thread has returned.
bool settle(Engine& e, Launch& L) {
  int exited = 0, at_barrier = 0, at_collective = 0;
  const Fiber* first_barrier = nullptr;
  const Fiber* first_collective = nullptr;
  for (int i = 0; i < L.threads; ++i) {
    const Fiber& f = e.fibers[std::size_t(i)];
    if (f.state == State::exited) ++exited;
    if (f.state == State::barrier) {
      ++at_barrier;
      if (first_barrier == nullptr) first_barrier = &f;
    }
    if (f.state == State::collective) {
      ++at_collective;
      if (first_collective == nullptr) first_collective = &f;
    }
  }
  if (exited == L.threads) return false;
  if (at_collective == 0 && exited > 0) {
    fail(std::to_string(at_barrier) + " threads wait at " + barrier_name(first_barrier->op) + " (" + at(first_barrier->where) +
         ") while " + std::to_string(exited) + " have returned: a barrier every thread of the block must reach");
  }
  if (at_collective == 0) {
    int count = 0;
    for (int i = 0; i < L.threads; ++i) {
      const Fiber& f = e.fibers[std::size_t(i)];
      if (f.where.line != first_barrier->where.line ||
          (f.where.file != first_barrier->where.file && std::strcmp(f.where.file, first_barrier->where.file) != 0) ||
          f.op != first_barrier->op) {
        fail("the threads of the block wait at different barriers: thread " + std::to_string(first_barrier->linear) + " at " +
             barrier_name(first_barrier->op) + " (" + at(first_barrier->where) + "), thread " + std::to_string(f.linear) + " at " +
             barrier_name(f.op) + " (" + at(f.where) + ")");
      }
      count += f.pred;
    }
    const int op = first_barrier->op;
    const int result = op == 1 ? count : op == 2 ? int(count == L.threads) : op == 3 ? int(count > 0) : 0;
    for (int i = 0; i < L.threads; ++i) {
      Fiber& f = e.fibers[std::size_t(i)];
      f.result = uint64_t(result);
      f.state = State::ready;
    }
    ++g_barriers;
    return true;
  }
  // Lanes wait at a collective for lanes that wait elsewhere or have returned.
  const Fiber& c = *first_collective;
  const int warp = c.linear / 32;
  std::string others;
  for (int l = 0; l < 32; ++l) {
    const int i = warp * 32 + l;
    if (((c.mask >> l) & 1u) == 0 || i >= L.threads) continue;
    const Fiber& o = e.fibers[std::size_t(i)];
    if (o.state == State::barrier) {
      others = "lane " + std::to_string(l) + " waits at " + barrier_name(o.op) + " (" + at(o.where) + ")";
      break;
    }
    if (o.state == State::collective && (o.kind != c.kind || o.mask != c.mask)) {
      others =
          "lane " + std::to_string(l) + " waits at " + collective_name(o.kind) + " (" + at(o.where) + ", mask " + hex(o.mask) + ")";
      break;
    }
  }
  fail("warp " + std::to_string(warp) + " lane " + std::to_string(c.linear % 32) + " waits at " + collective_name(c.kind) + " (" +
       at(c.where) + ", mask " + hex(c.mask) + ") for lanes that never arrive" + (others.empty() ? "" : ": " + others));
}

void abandon_block(Engine& e, Launch& L) {
  for (int i = 0; i < L.threads; ++i) {
    Fiber& f = e.fibers[std::size_t(i)];
    if (f.state != State::exited) f.dirty = true;
    f.state = State::exited;
  }
  release_shared(L);
}

void run_block(Engine& e, Launch& L, Order order_kind) {
  const dim3 bd = L.cfg.block;
  std::fill(std::begin(L.waiting), std::end(L.waiting), 0u);
  std::fill(std::begin(L.exited), std::end(L.exited), 0u);
  for (int i = 0; i < L.threads; ++i) {
    Fiber& f = e.fibers[std::size_t(i)];
    prepare(f, i);
    f.linear = i;
    f.ts.thread_idx = uint3{unsigned(i) % bd.x, (unsigned(i) / bd.x) % bd.y, unsigned(i) / (bd.x * bd.y)};
    f.ts.block_idx = L.block;
    f.ts.block_dim = bd;
    f.ts.grid_dim = L.cfg.grid;
  }
  if (L.cfg.shared > 0) {
    L.shared.push_back({nullptr, allocate_guarded(L.cfg.shared, 16), L.cfg.shared});
    tsan_release(&L.tsan_start);  // the block's threads see the dynamic array as allocated
  }
  e.order.resize(std::size_t(L.threads));
  try {
    for (;;) {
      order_for(e, e.order, order_kind);
      e.next = 0;
      bool ran = false;
      // A thread that waits or returns hands over to the next ready one itself (hand_off); back
      // here at the round's end or on a fault.
      while (Fiber* f = next_in_round(e)) {
        ran = true;
        resume(e, *f);
        if (!L.error.empty()) fail(L.error);
      }
      if (!ran && !settle(e, L)) break;
    }
  } catch (const std::exception& x) {
    abandon_block(e, L);
    throw Error(at(L.where) + ": kernel '" + L.kernel + "' block " + block_name(L.block) + " (schedule " + current_schedule().name() +
                "): " + x.what());
  }
  tsan_acquire(&L.tsan_end);  // the block's writes to its shared memory happen before it is freed
  const std::string overrun = release_shared(L);
  if (!overrun.empty()) {
    throw Error(at(L.where) + ": kernel '" + L.kernel + "' block " + block_name(L.block) + " (schedule " + current_schedule().name() +
                "): " + overrun);
  }
  g_threads += uint64_t(L.threads);
}

// False (after runtime::launch_refused) when the launch is invalid.
bool check_config(const Where& w, const char* kernel, const detail::LaunchConfig& c) {
  if (!runtime::stream_live(c.stream)) {
    runtime::launch_refused(cudaErrorInvalidResourceHandle,
                            at(w) + ": launch of '" + kernel +
                                "' on a stream that is not (or no longer) a live stream (cudaErrorInvalidResourceHandle)");
    return false;
  }
  const dim3 g = c.grid, b = c.block;
  std::string why;
  if (g.x == 0 || g.y == 0 || g.z == 0) why = "an empty grid";
  else if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) why = "a grid past the limits (2^31-1, 65535, 65535)";
  else if (b.x == 0 || b.y == 0 || b.z == 0) why = "an empty block";
  else if (b.x > 1024 || b.y > 1024 || b.z > 64) why = "a block past the limits (1024, 1024, 64)";
  else if (uint64_t(b.x) * b.y * b.z > 1024) why = "a block of more than 1024 threads";
  else if (c.shared > kSharedLimit) why = "more dynamic shared memory than 48 KiB";
  if (why.empty()) {
    runtime::finish_stream_work(c.stream);  // what the stream holds (a collective) runs first
    return true;
  }
  runtime::launch_refused(cudaErrorInvalidConfiguration,
                          at(w) + ": launch of '" + kernel + "' with grid (" + std::to_string(g.x) + "," + std::to_string(g.y) + "," +
                              std::to_string(g.z) + ") and block (" + std::to_string(b.x) + "," + std::to_string(b.y) + "," +
                              std::to_string(b.z) + "), " + std::to_string(c.shared) + " bytes of dynamic shared memory: " + why +
                              " is an invalid configuration (cudaErrorInvalidConfiguration)");
  return false;
}

}  // namespace

// --- public API --------------------------------------------------------------------------------

std::string Schedule::name() const {
  switch (order) {
    case Order::forward: return "forward";
    case Order::reverse: return "reverse";
    case Order::random: return "random:" + std::to_string(seed);
  }
  return "?";
}

Schedule parse_schedule(const std::string& text) {
  if (text == "forward") return {Order::forward, 0};
  if (text == "reverse") return {Order::reverse, 0};
  if (text.rfind("random:", 0) == 0 && text.size() > 7 && text.find_first_not_of("0123456789", 7) == std::string::npos &&
      text.size() <= 7 + 19) {
    return {Order::random, std::stoull(text.substr(7))};
  }
  throw std::invalid_argument("'" + text + "' is not a schedule: expected forward, reverse or random:SEED (a decimal seed)");
}

void set_schedule(const Schedule& s) {
  std::lock_guard<std::mutex> lock(g_schedule_mu);
  g_schedule = s;
  ++g_schedule_epoch;
}

Schedule current_schedule() {
  std::lock_guard<std::mutex> lock(g_schedule_mu);
  return g_schedule;
}

std::vector<Schedule> test_schedules() {
  if (const char* env = std::getenv("ABLATE_EMU_SCHEDULE"); env != nullptr && *env != '\0') return {parse_schedule(env)};
  return {{Order::forward, 0}, {Order::reverse, 0}, {Order::random, 1}, {Order::random, 20261125}};
}

Stats stats() { return {g_launches.load(), g_blocks.load(), g_threads.load(), g_barriers.load(), g_collectives.load()}; }

namespace detail {

void* shared_memory(const SharedSite& site) {
  Engine& e = engine();
  Fiber& f = running(e, "a __shared__ declaration");
  (void)f;
  Launch& L = *e.launch;
  for (const SharedAlloc& a : L.shared) {
    if (a.site == &site) {
      tsan_acquire(a.data);
      return a.data;
    }
  }
  char* data = nullptr;
  {
    AsScheduler as_scheduler(e);
    L.static_shared += site.bytes;
    if (L.static_shared + L.cfg.shared > kSharedLimit) {
      fail(std::string("__shared__ '") + site.name + "' (" + site.file + ":" + std::to_string(site.line) +
           ") brings the block's shared memory to " + std::to_string(L.static_shared + L.cfg.shared) +
           " bytes, past the 49152 a block gets without opting in");
    }
    L.shared.push_back({&site, allocate_guarded(site.bytes, site.align), site.bytes});
    data = L.shared.back().data;
    tsan_release(data);
  }
  tsan_acquire(data);
  return data;
}

void* dynamic_shared_memory(std::size_t align) {
  Engine& e = engine();
  running(e, "an extern __shared__ declaration");
  Launch& L = *e.launch;
  for (const SharedAlloc& a : L.shared) {
    if (a.site == nullptr) return a.data;
  }
  (void)align;
  fail("an extern __shared__ array in a kernel launched with no dynamic shared memory");
}

int block_barrier(Where w, int op, int predicate) {
  Engine& e = engine();
  Fiber& f = running(e, barrier_name(op));
  f.state = State::barrier;
  f.where = w;
  f.op = op;
  f.pred = predicate;
  tsan_release(&e.launch->tsan_barrier);
  yield_to_scheduler(e, f);
  tsan_acquire(&e.launch->tsan_barrier);
  return int(f.result);
}

uint64_t warp_collective(Where w, Collective kind, unsigned mask, uint64_t value, int arg, int width) {
  Engine& e = engine();
  Fiber& f = running(e, collective_name(kind));
  Launch& L = *e.launch;
  const int warp = f.linear / 32, lane = f.linear % 32;
  const int lanes = std::min(32, L.threads - warp * 32);
  const unsigned exist = existing_lanes(L, warp);
  const auto here = [&] { return std::string(collective_name(kind)) + " (" + at(w) + ", mask " + hex(mask) + ")"; };
  if (((mask >> lane) & 1u) == 0)
    fail("lane " + std::to_string(lane) + " of warp " + std::to_string(warp) + " calls " + here() + ", which does not name it");
  // A shuffle's mask must name only lanes that exist and have not returned (their values are what
  // it exchanges); a vote or __syncwarp counts the named lanes that have not exited, as CUDA says.
  if (!is_vote(kind)) {
    if ((mask & ~exist) != 0) {
      fail(here() + " names lanes " + lanes_of(mask & ~exist) + " that do not exist: the block has " + std::to_string(L.threads) +
           " threads, so warp " + std::to_string(warp) + " has " + std::to_string(lanes) + " lanes");
    }
    const unsigned gone = mask & returned_lanes(L, warp);
    if (gone != 0) fail(here() + " names lanes " + lanes_of(gone) + ", which have returned");
  }
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    fail(here() + ": width " + std::to_string(width) + " is not a power of two up to 32");
  set_state(L, f, State::collective);
  f.where = w;
  f.kind = kind;
  f.mask = mask;
  f.value = value;
  f.arg = arg;
  f.width = width;
  tsan_release(&L.tsan_warp[warp]);
  if (!complete_collective(e, L, warp, f)) yield_to_scheduler(e, f);
  tsan_acquire(&L.tsan_warp[warp]);
  return f.result;
}

unsigned active_mask() {
  Fiber& f = running(engine(), "__activemask");
  return 1u << (f.linear % 32);
}

}  // namespace detail

namespace {

// Completes the collective `arrived` waits at when every lane it needs has arrived: the results
// set and those lanes ready. False while some have not.
bool complete_collective(Engine& e, Launch& L, int warp, const Fiber& arrived) {
  using detail::Collective;
  const Collective kind = arrived.kind;
  const unsigned mask = arrived.mask;
  const int width = arrived.width;
  const unsigned need = is_vote(kind) ? (mask & existing_lanes(L, warp) & ~returned_lanes(L, warp)) : mask;
  if ((need & ~L.waiting[warp]) != 0) return false;  // some lane has not arrived
  Fiber* group[32] = {};
  for (int l = 0; l < 32; ++l) {
    if (((need >> l) & 1u) == 0) continue;
    Fiber& o = e.fibers[std::size_t(warp * 32 + l)];
    if (o.state != State::collective) return false;
    group[l] = &o;
  }
  const auto here = [&] { return std::string(collective_name(kind)) + " (" + at(arrived.where) + ", mask " + hex(mask) + ")"; };
  for (int l = 0; l < 32; ++l) {
    const Fiber* o = group[l];
    if (o != nullptr && (o->kind != kind || o->mask != mask || o->width != width)) {
      fail("the lanes of warp " + std::to_string(warp) + " meet at different collectives: lane " +
           std::to_string(arrived.linear % 32) + " at " + here() + ", lane " + std::to_string(l) + " at " + collective_name(o->kind) +
           " (" + at(o->where) + ", mask " + hex(o->mask) + ")");
    }
  }
  unsigned votes = 0;
  for (int l = 0; l < 32; ++l) {
    if (group[l] != nullptr && group[l]->value != 0) votes |= 1u << l;
  }
  for (int l = 0; l < 32; ++l) {
    Fiber* o = group[l];
    if (o == nullptr) continue;
    const int64_t base = l & ~(width - 1);
    const int64_t delta = int64_t(uint32_t(o->arg));  // shfl_up/down take an unsigned delta
    int64_t src = l;
    switch (kind) {
      case Collective::shfl: src = base + (o->arg & (width - 1)); break;
      case Collective::shfl_up: src = l - delta < base ? l : l - delta; break;
      case Collective::shfl_down: src = l + delta >= base + width ? l : l + delta; break;
      case Collective::shfl_xor: {
        const int64_t x = int64_t(uint32_t(l) ^ uint32_t(o->arg));
        src = x >= base + width ? l : x;
        break;
      }
      default: break;
    }
    switch (kind) {
      case Collective::ballot: o->result = votes; break;
      case Collective::any: o->result = votes != 0; break;
      case Collective::all: o->result = votes == need; break;
      case Collective::syncwarp: o->result = 0; break;
      default:
        if (src < 0 || src >= 32 || group[src] == nullptr) {
          fail("lane " + std::to_string(l) + " of warp " + std::to_string(warp) + " reads lane " + std::to_string(src) + " at " +
               here() + ", which the mask does not name: its value is undefined");
        }
        o->result = group[src]->value;
    }
    set_state(L, *o, State::ready);
  }
  ++g_collectives;
  return true;
}

}  // namespace

namespace detail {

bool capturing(const void* stream) { return runtime::capturing(stream); }
void capture_work(const void* stream, std::function<void()> work) { runtime::capture_node(stream, std::move(work)); }

void capture_grid(Where w, const char* kernel, const LaunchConfig& c, void (*body)(void*), std::shared_ptr<void> ctx) {
  if (engine().launch != nullptr)
    throw Error(at(w) + ": kernel '" + kernel + "' launched from inside a kernel (dynamic parallelism is not interpreted)");
  if (!check_config(w, kernel, c)) return;
  runtime::capture_node(c.stream, [w, kernel, c, body, ctx = std::move(ctx)] { run_grid(w, kernel, c, body, ctx.get()); });
}

void run_grid(Where w, const char* kernel, const LaunchConfig& c, void (*body)(void*), void* ctx) {
  Engine& e = engine();
  if (e.launch != nullptr)
    throw Error(at(w) + ": kernel '" + kernel + "' launched from inside a kernel (dynamic parallelism is not interpreted)");
  if (!check_config(w, kernel, c)) return;
  const DeviceAccess access;  // the kernel reads and writes device memory
  const Schedule s = current_schedule();
  {
    std::lock_guard<std::mutex> lock(g_schedule_mu);
    if (e.epoch != g_schedule_epoch) {
      e.epoch = g_schedule_epoch;
      e.rng.seed(s.seed);
    }
  }
#ifdef ABLATE_EMU_TSAN
  if (e.sched_tsan == nullptr) e.sched_tsan = __tsan_get_current_fiber();
#endif
  Launch L;
  L.where = w;
  L.kernel = kernel;
  L.cfg = c;
  L.body = body;
  L.ctx = ctx;
  L.threads = int(c.block.x * c.block.y * c.block.z);
  e.launch = &L;
  struct Reset {
    Engine& e;
    ~Reset() { e.launch = nullptr; }
  } reset{e};
  const uint64_t blocks = uint64_t(c.grid.x) * c.grid.y * c.grid.z;
  std::vector<uint64_t> order;
  if (s.order != Order::forward) {
    order.resize(blocks);
    std::iota(order.begin(), order.end(), uint64_t(0));
    if (s.order == Order::reverse) std::reverse(order.begin(), order.end());
    if (s.order == Order::random) std::shuffle(order.begin(), order.end(), e.rng);
  }
  tsan_release(&L.tsan_start);
  for (uint64_t k = 0; k < blocks; ++k) {
    const uint64_t b = order.empty() ? k : order[k];
    L.block = uint3{unsigned(b % c.grid.x), unsigned((b / c.grid.x) % c.grid.y), unsigned(b / (uint64_t(c.grid.x) * c.grid.y))};
    run_block(e, L, s.order);
  }
  tsan_acquire(&L.tsan_end);
  ++g_launches;
  g_blocks += blocks;
  check_device_allocations((std::string("kernel '") + kernel + "' launched at " + at(w)).c_str());
}

}  // namespace detail

}  // namespace ablate::emu
