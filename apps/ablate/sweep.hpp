// `ablate sweep`: the sweep file, its arms, and the two ways of running them.
//
//   sweep_spec.cpp   the sweep file read into a Sweep: grid, explicit arms or random search,
//                    repeats, the early-stopping rule, the [slurm] section; `--set` overrides
//   sweep_arms.cpp   one arm's process: what it starts from (skip, resume, afresh), the child
//                    `ablate train`, its progress from metrics.jsonl, early stopping, arm.json
//   sweep_local.cpp  the local launcher: N arms at once on this machine, with live progress
//   sweep_slurm.cpp  the slurm launcher: one sbatch job-array script, submission, `--status`,
//                    and `ablate sweep-arm`, which runs one arm inside an array task
//   cmd_sweep.cpp    the commands: sweep (validation, then a launcher) and report
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ablate::cli::sweep {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Override {
  std::string key;    // "batching.name"
  std::string value;  // TOML text
  std::string label;  // "packed"
};

// Where an arm trains under Slurm: the allocation of one array task. Arms may set these with
// "slurm.<key>" entries in [sweep.grid] / [[sweep.arms]]; the [slurm] section gives the defaults.
struct Resources {
  int nodes = 1;
  int tasks_per_node = 1;
  int gpus_per_node = 0;
  int cpus_per_task = 1;
  int ranks() const { return nodes * tasks_per_node; }
  bool operator<(const Resources& o) const;
};

struct SlurmSpec {
  std::string partition, account, time;  // empty: the cluster's default
  std::string job_name;                  // default: ablate-<sweep name>
  std::string mpi = "pmix";              // srun --mpi=... for arms of several ranks
  int max_parallel = 0;                  // the array's %N throttle (0: none)
  // Seconds before the time limit (or a preemption) at which Slurm sends the batch script SIGUSR1
  // (#SBATCH --signal=B:USR1@N): the arm checkpoints after its step and is requeued. 0: none.
  int warning_seconds = 90;
  std::vector<std::string> extra;  // lines put in the script as they are, after the #SBATCH block
  Resources resources;
};

// ASHA-style early stopping: at each rung (a step), an arm whose validation loss is among the worst
// `fraction` of the arms that reached that rung (at least `min_arms` of them, itself included) stops.
struct EarlyStop {
  std::vector<int64_t> rungs;  // empty: no early stopping
  double fraction = 0.5;
  int min_arms = 2;
  bool enabled() const { return !rungs.empty(); }
};

struct Arm {
  std::string name;   // directory name
  std::string group;  // name without the repeat suffix (what the report aggregates over)
  int repeat = 0;
  std::vector<Override> overrides;  // the arm's own (grid, list or draw), not the common ones
  Resources resources;              // from [slurm] and the arm's "slurm.*" overrides
  // [[sweep.arms]] expected = x: the speed-up in real tokens/s over the arm listed before it that a
  // claim being checked expects (the report sets the measured ratio beside it); 0: none.
  double expected = 0;
};

struct RandomSearch {
  int64_t samples = 0;
  uint64_t seed = 0;
};

struct Sweep {
  fs::path file;
  fs::path base;
  std::string name;
  int repeats = 1;
  std::string baseline;         // the arm group the report compares the others with ("": the first)
  std::string search = "grid";  // "grid" | "random"
  std::string launcher = "local";
  RandomSearch random;
  std::vector<Override> common;  // [sweep.set]
  std::vector<std::string> axes;
  std::vector<Arm> arms;
  EarlyStop early_stop;
  SlurmSpec slurm;
};

// Reads and checks a sweep file. `sets` are the command line's "key=value" overrides of the sweep
// file itself (`[sweep]` and `[slurm]` keys, e.g. "slurm.time=00:30:00", "sweep.launcher=slurm").
Sweep read_sweep(const fs::path& file, const std::vector<std::string>& sets = {});

// The reproducible draws of a random search: `samples` x the ranges, from a 64-bit Mersenne
// Twister seeded with `seed` (fully specified by C++, so the same on every machine), a draw
// u = (bits >> 11) / 2^53 in [0, 1) per key in key order. Values are rounded to 6 significant
// digits (so that log/exp's last bit cannot change an arm's text).
struct Range {
  std::string key;
  std::string kind;                          // "uniform" | "log_uniform" | "int_uniform" | "choice"
  double lo = 0, hi = 0;                     // uniform, log_uniform, int_uniform
  std::vector<std::string> choices, labels;  // choice: TOML text and label per value
};
std::vector<std::vector<Override>> draw_random(const std::vector<Range>& ranges, int64_t samples, uint64_t seed);

// ---- one arm's process (sweep_arms.cpp) ----------------------------------------------------------

// Everything `ablate train` is given for one arm, except --resume / --run-dir.
struct ArmPlan {
  Arm arm;
  std::vector<std::string> sets;  // "key=value", common then the arm's own then the repeat's seed
  json overrides;                 // the arm's own overrides, for results
  fs::path dir;
  int64_t steps = 0;  // run.steps, for progress
  int64_t eval_every = 0;
  bool done = false;
  bool resume = false;
  bool restart = false;  // an earlier attempt with other overrides is there: started afresh
};

// The arm.json record (status: running | completed | failed | stopped) with extra fields.
void record_arm(const ArmPlan& p, const std::string& status, int code, double wall, const std::string& error,
                const json& extra = json::object());

// Decides done / resume / restart from the arm's files (typed reads: a damaged file is an input
// error). A stopped arm (early stopping) counts as done.
void decide_start(ArmPlan& p);
// Renames an afresh-started arm's old log and removes its old summary.
void clear_for_restart(const ArmPlan& p);

// What a running arm has logged so far (its complete metrics.jsonl lines).
struct ArmProgress {
  int64_t step = -1;
  double loss = NAN;
  double elapsed_s = NAN;
  std::map<int64_t, double> val_loss;  // step -> validation loss
};
ArmProgress read_progress(const fs::path& dir);

// The validation loss an arm has at a rung: its first evaluation at a step >= rung.
std::optional<double> rung_value(const ArmProgress& p, int64_t rung);

// The rule: whether `value` is among the worst `fraction` of `others` + itself (ties count in the
// arm's favour); false while fewer than min_arms arms reached the rung.
bool stopped_at_rung(double value, const std::vector<double>& others, const EarlyStop& rule);

// A child `ablate train` for the arm, its output to <dir>/train.log; with `prefix` (e.g. srun and
// its options) in front of the executable.
pid_t spawn_train(const fs::path& exe, const fs::path& base, const ArmPlan& p, const std::vector<std::string>& prefix = {});

// One running arm: polled for progress and the early-stopping rule until its process ends.
struct ArmRun {
  std::size_t index = 0;
  pid_t pid = -1;
  std::chrono::steady_clock::time_point start;
  ArmProgress progress;
  std::uintmax_t metrics_offset = 0;                 // the bytes of metrics.jsonl read so far
  std::chrono::steady_clock::time_point first_seen;  // when a step was first seen (for the ETA)
  int64_t first_step = -1;
  std::size_t rungs_passed = 0;
  bool stopping = false;
  std::string stop_reason;
  json rung_values = json::object();
};

// Reads the arm's progress; applies the rule at every rung it reached since the last poll, reading
// the other arms' logs under `sweep_dir`. Returns the event lines to print (rung passed, stopping).
std::vector<std::string> poll_arm(ArmRun& r, const ArmPlan& p, const std::vector<ArmPlan>& all, const EarlyStop& rule);

// After the process ended: records arm.json and returns the status word ("completed", "failed",
// "stopped") and a one-line description.
std::pair<std::string, std::string> finish_arm(const ArmRun& r, const ArmPlan& p, int wait_status);

fs::path self_exe();
void write_json_file(const fs::path& p, const json& j);

// ---- launchers -----------------------------------------------------------------------------------

// Trains the arms here, `parallel` at once; the progress goes to stdout (a live block on a
// terminal, a line per event otherwise). Returns the number of failed arms.
std::size_t run_local(const Sweep& s, std::vector<ArmPlan>& plans, int parallel);

// Writes plan.json (what `ablate sweep-arm` reads) for either launcher.
void write_plan(const fs::path& out, const Sweep& s, const std::vector<ArmPlan>& plans);

// Writes slurm/sweep.sbatch, submits the arms that are neither done nor queued, records the job
// ids in slurm/jobs.json. Returns 0.
int submit_slurm(const Sweep& s, const fs::path& out, std::vector<ArmPlan>& plans);
// Prints each arm's state from squeue (and sacct where the cluster keeps accounting) and its run
// directory. Returns 0.
int slurm_status(const fs::path& out);

}  // namespace ablate::cli::sweep
