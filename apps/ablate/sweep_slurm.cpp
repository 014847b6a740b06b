// The slurm launcher. `ablate sweep --launcher slurm` writes <out>/plan.json (every arm's `--set`s
// and resources) and one job-array script, <out>/slurm/sweep.sbatch, whose task K runs
// `ablate sweep-arm <out> K`; it submits the arms that are neither finished nor queued (one
// `sbatch --array` per distinct allocation shape, the shape given on sbatch's command line),
// records the job ids in <out>/slurm/jobs.json, and returns. `ablate sweep --status` reads Slurm's
// queue (squeue; sacct where the cluster keeps accounting) and the arms' run directories.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "ablate/atomic_file.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "commands.hpp"
#include "json_read.hpp"
#include "sweep.hpp"

extern char** environ;

namespace ablate::cli {

using namespace sweep;

namespace sweep {

namespace {

struct Captured {
  int code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a program (found on PATH) and returns its exit code and output; a program that is not there
// gives code 127.
Captured capture(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) throw_runtime_error("sweep", std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  std::vector<std::string> a = argv;
  std::vector<char*> cargv;
  for (std::string& x : a) cargv.push_back(x.data());
  cargv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  Captured c;
  if (rc != 0) {
    close(fds[0]);
    c.code = 127;
    c.output = argv[0] + ": " + std::strerror(rc);
    return c;
  }
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (c.output.size() < (std::size_t(4) << 20)) c.output.append(buf, std::size_t(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return c;
}

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

json resources_json(const Resources& r) {
  return {{"nodes", r.nodes},
          {"tasks_per_node", r.tasks_per_node},
          {"gpus_per_node", r.gpus_per_node},
          {"cpus_per_task", r.cpus_per_task}};
}

// The allocation options of one shape, for the script's #SBATCH lines and sbatch's command line.
std::vector<std::string> resource_options(const Resources& r) {
  std::vector<std::string> o = {"--nodes=" + std::to_string(r.nodes), "--ntasks-per-node=" + std::to_string(r.tasks_per_node),
                                "--cpus-per-task=" + std::to_string(r.cpus_per_task)};
  if (r.gpus_per_node > 0) o.push_back("--gpus-per-node=" + std::to_string(r.gpus_per_node));
  return o;
}

// A path as a single-quoted shell word.
std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// "0-3,5,7-8": the array indices as sbatch takes them.
std::string index_list(const std::vector<std::size_t>& idx) {
  std::string out;
  for (std::size_t i = 0; i < idx.size();) {
    std::size_t j = i;
    while (j + 1 < idx.size() && idx[j + 1] == idx[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(idx[i]) + (j > i ? "-" + std::to_string(idx[j]) : "");
    i = j + 1;
  }
  return out;
}

std::string script_text(const Sweep& s, const fs::path& out, const fs::path& exe) {
  std::ostringstream t;
  t << "#!/bin/bash\n"
    << "# ablate sweep '" << s.name << "' from " << s.file.string() << ": array task K trains arm K of plan.json\n"
    << "# (written by `ablate sweep --launcher slurm`; submitted with each allocation shape's options on sbatch's\n"
    << "# command line, which take precedence over the lines below).\n"
    << "#SBATCH --job-name=" << s.slurm.job_name << "\n"
    << "#SBATCH --output=" << (out / "slurm" / "%A_%a.out").string() << "\n"
    << "#SBATCH --chdir=" << fs::current_path().string() << "\n";
  if (!s.slurm.partition.empty()) t << "#SBATCH --partition=" << s.slurm.partition << "\n";
  if (!s.slurm.account.empty()) t << "#SBATCH --account=" << s.slurm.account << "\n";
  if (!s.slurm.time.empty()) t << "#SBATCH --time=" << s.slurm.time << "\n";
  for (const std::string& o : resource_options(s.slurm.resources)) t << "#SBATCH " << o << "\n";
  // Preemption and time limits: SIGUSR1 to this script (which passes it to the training) N seconds
  // before; the arm checkpoints after its step, and the task is requeued and resumes from there.
  t << "#SBATCH --requeue\n";
  if (s.slurm.warning_seconds > 0) t << "#SBATCH --signal=B:USR1@" << s.slurm.warning_seconds << "\n";
  for (const std::string& line : s.slurm.extra) t << line << "\n";
  t << "exec " << shell_quoted(exe.string()) << " sweep-arm " << shell_quoted(out.string()) << " \"$SLURM_ARRAY_TASK_ID\"\n";
  return t.str();
}

// A path written into #SBATCH lines cannot be quoted there.
void require_plain_path(const fs::path& p, const std::string& what) {
  if (!std::regex_match(p.string(), std::regex("^[A-Za-z0-9_./+,:@=-]+$"))) {
    throw_input_error(p.string(), what + " goes into the job script's #SBATCH lines, which cannot quote: use a path of letters, "
                                         "digits and _./+,:@=- only");
  }
}

// The array tasks of our jobs that slurmctld knows (pending, running, and finished ones for
// MinJobAge): "JOB_INDEX" -> state, e.g. "RUNNING", "FAILED".
std::map<std::string, std::string> queued_tasks(const std::set<std::string>& job_ids) {
  std::map<std::string, std::string> out;
  if (job_ids.empty()) return out;
  const Captured q = capture({"squeue", "-h", "-r", "-t", "all", "-o", "%i|%T"});
  if (q.code != 0) {
    throw_runtime_error("squeue",
                        (q.code == 127 ? "is not installed or not on PATH: " : "failed (exit " + std::to_string(q.code) + "): ") +
                            trimmed(q.output));
  }
  std::istringstream in(q.output);
  for (std::string line; std::getline(in, line);) {
    const auto bar = line.find('|');
    if (bar == std::string::npos) continue;
    const std::string id = line.substr(0, bar);
    if (job_ids.count(id.substr(0, id.find('_'))) > 0) out[id] = trimmed(line.substr(bar + 1));
  }
  return out;
}

// A state in which the task will still run (or runs): such an arm is not submitted again.
bool active(const std::string& state) {
  static const std::set<std::string> states = {"PENDING",     "RUNNING",       "CONFIGURING", "COMPLETING", "SUSPENDED",
                                               "REQUEUED",    "RESIZING",      "SIGNALING",   "STAGE_OUT",  "REQUEUE_HOLD",
                                               "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"};
  return states.count(state) > 0;
}

std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!trimmed(line).empty()) last = trimmed(line);
  }
  return last;
}

// What sacct knows of our jobs' tasks; empty where the cluster keeps no accounting.
std::map<std::string, std::string> accounted_tasks(const std::set<std::string>& job_ids) {
  std::map<std::string, std::string> out;
  if (job_ids.empty()) return out;
  std::string ids;
  for (const std::string& j : job_ids) ids += (ids.empty() ? "" : ",") + j;
  const Captured a = capture({"sacct", "-n", "-P", "-X", "-j", ids, "-o", "JobID,State"});
  if (a.code != 0) return out;
  std::istringstream in(a.output);
  for (std::string line; std::getline(in, line);) {
    const auto bar = line.find('|');
    if (bar != std::string::npos) out[line.substr(0, bar)] = trimmed(line.substr(bar + 1));
  }
  return out;
}

json read_jobs(const fs::path& out) {
  const fs::path f = out / "slurm" / "jobs.json";
  if (!fs::exists(f)) return {{"submissions", json::array()}};
  const std::string text = read_json_text(f, "Slurm job list", kMaxJsonBytes);
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("submissions") || !j["submissions"].is_array()) {
    throw_input_error(f.string(), "is not the job list `ablate sweep --launcher slurm` writes ({\"submissions\": [...]})");
  }
  for (const json& sub : j["submissions"]) {
    if (!sub.is_object() || !sub.contains("job_id") || !sub["job_id"].is_string() || !sub.contains("indices") ||
        !sub["indices"].is_array()) {
      throw_input_error(f.string(), "a submission lacks its string job_id or its indices");
    }
  }
  return j;
}

// Each arm index's latest "JOB_INDEX" task id.
std::map<std::size_t, std::string> task_ids(const json& jobs) {
  std::map<std::size_t, std::string> out;
  for (const json& sub : jobs["submissions"]) {
    for (const json& i : sub["indices"]) {
      if (i.is_number_unsigned())
        out[i.get<std::size_t>()] = sub["job_id"].get<std::string>() + "_" + std::to_string(i.get<std::size_t>());
    }
  }
  return out;
}

std::set<std::string> job_id_set(const json& jobs) {
  std::set<std::string> ids;
  for (const json& sub : jobs["submissions"]) ids.insert(sub["job_id"].get<std::string>());
  return ids;
}

std::string now_text() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// ---- plan.json ------------------------------------------------------------------------------------

const char* kPlanWhat = "sweep plan (plan.json, written by `ablate sweep`)";

ArmPlan plan_from_json(const fs::path& file, const json& a) {
  ArmPlan p;
  try {
    p.arm.name = a.at("name").get<std::string>();
    p.arm.group = a.at("group").get<std::string>();
    p.arm.repeat = a.at("repeat").get<int>();
    p.overrides = a.at("overrides");
    p.sets = a.at("sets").get<std::vector<std::string>>();
    p.dir = a.at("dir").get<std::string>();
    p.steps = a.at("steps").get<int64_t>();
    p.eval_every = a.at("eval_every").get<int64_t>();
    const json& r = a.at("resources");
    p.arm.resources = {r.at("nodes").get<int>(), r.at("tasks_per_node").get<int>(), r.at("gpus_per_node").get<int>(),
                       r.at("cpus_per_task").get<int>()};
  } catch (const json::exception& e) {
    throw_input_error(file.string(), std::string("an arm of the ") + kPlanWhat + " is damaged: " + e.what());
  }
  if (p.arm.name.empty() || p.arm.resources.ranks() < 1 || p.dir.filename() != p.arm.name) {
    throw_input_error(file.string(), std::string("an arm of the ") + kPlanWhat + " is damaged (name, dir or resources)");
  }
  return p;
}

struct Plan {
  fs::path base;
  std::string mpi;
  EarlyStop early_stop;
  std::vector<ArmPlan> arms;
};

Plan read_plan(const fs::path& out) {
  const fs::path file = out / "plan.json";
  const std::string text = read_json_text(file, kPlanWhat, kMaxJsonBytes);
  const json j = json::parse(text, nullptr, false);
  Plan plan;
  try {
    plan.base = j.at("base").get<std::string>();
    plan.mpi = j.at("mpi").get<std::string>();
    const json& e = j.at("early_stop");
    plan.early_stop.rungs = e.at("rungs").get<std::vector<int64_t>>();
    plan.early_stop.fraction = e.at("fraction").get<double>();
    plan.early_stop.min_arms = e.at("min_arms").get<int>();
    for (const json& a : j.at("arms")) plan.arms.push_back(plan_from_json(file, a));
  } catch (const json::exception& e) {
    throw_input_error(file.string(), std::string("the ") + kPlanWhat + " does not read: " + e.what());
  }
  return plan;
}

volatile sig_atomic_t g_terminated = 0;
void on_term(int) { g_terminated = 1; }
volatile sig_atomic_t g_warned = 0;  // SIGUSR1: 1 received, 2 passed on to the training
void on_warning(int) {
  if (g_warned == 0) g_warned = 1;
}

// A preempted arm's task back in Slurm's queue (scontrol requeue of this array task): it resumes
// from the checkpoint when it runs again. "" or what went wrong.
std::string requeue_task() {
  const char* id = std::getenv("SLURM_JOB_ID");  // an array task's own job id
  if (id == nullptr) return "not under Slurm (no SLURM_JOB_ID): nothing requeues it; `ablate sweep` again resumes it";
  const Captured c = capture({"scontrol", "requeue", id});
  return c.code == 0 ? "" : "scontrol requeue " + std::string(id) + " failed (exit " + std::to_string(c.code) + "): " + c.output;
}

}  // namespace

void write_plan(const fs::path& out, const Sweep& s, const std::vector<ArmPlan>& plans) {
  json arms = json::array();
  for (const ArmPlan& p : plans) {
    arms.push_back({{"name", p.arm.name},
                    {"group", p.arm.group},
                    {"repeat", p.arm.repeat},
                    {"overrides", p.overrides},
                    {"sets", p.sets},
                    {"dir", fs::absolute(p.dir).lexically_normal().string()},
                    {"steps", p.steps},
                    {"eval_every", p.eval_every},
                    {"resources", resources_json(p.arm.resources)}});
  }
  const json plan = {{"sweep", s.name},
                     {"base", fs::absolute(s.base).lexically_normal().string()},
                     {"mpi", s.slurm.mpi},
                     {"early_stop",
                      {{"rungs", s.early_stop.rungs}, {"fraction", s.early_stop.fraction}, {"min_arms", s.early_stop.min_arms}}},
                     {"arms", arms}};
  write_json_file(out / "plan.json", plan);
}

int submit_slurm(const Sweep& s, const fs::path& out_given, std::vector<ArmPlan>& plans) {
  const fs::path out = fs::absolute(out_given).lexically_normal();
  require_plain_path(out, "the sweep directory");
  require_plain_path(fs::current_path(), "the working directory");
  json jobs = read_jobs(out);
  const std::map<std::string, std::string> queued = queued_tasks(job_id_set(jobs));
  const std::map<std::size_t, std::string> latest = task_ids(jobs);
  std::map<Resources, std::vector<std::size_t>> shapes;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const ArmPlan& p = plans[i];
    const auto task = latest.find(i);
    if (p.done) {
      std::cout << "  " << p.arm.name << ": finished, skipped\n";
    } else if (task != latest.end() && queued.count(task->second) > 0 && active(queued.at(task->second))) {
      std::cout << "  " << p.arm.name << ": " << queued.at(task->second) << " as " << task->second << ", not resubmitted\n";
    } else {
      shapes[p.arm.resources].push_back(i);
    }
  }
  fs::create_directories(out / "slurm");
  const fs::path script = out / "slurm" / "sweep.sbatch";
  write_file_atomic(script, script_text(s, out, self_exe()));
  fs::permissions(script, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec, fs::perm_options::add);
  if (shapes.empty()) std::cout << "nothing to submit: every arm is finished or queued\n";
  for (const auto& [shape, indices] : shapes) {
    std::vector<std::string> argv = {"sbatch", "--parsable",
                                     "--array=" + index_list(indices) +
                                         (s.slurm.max_parallel > 0 ? "%" + std::to_string(s.slurm.max_parallel) : "")};
    for (const std::string& o : resource_options(shape)) argv.push_back(o);
    argv.push_back(script.string());
    const Captured c = capture(argv);
    const std::string job = last_line(c.output);  // "ID" or "ID;CLUSTER"
    const std::string id = job.substr(0, job.find(';'));
    if (c.code != 0 || !std::regex_match(id, std::regex("^[0-9]+$"))) {
      throw_runtime_error("sbatch",
                          (c.code == 127 ? "is not installed or not on PATH: " : "failed (exit " + std::to_string(c.code) + "): ") +
                              trimmed(c.output) + " (script " + script.string() + ")");
    }
    json names = json::array();
    for (std::size_t i : indices) names.push_back(plans[i].arm.name);
    jobs["submissions"].push_back(
        {{"job_id", id}, {"indices", indices}, {"arms", names}, {"resources", resources_json(shape)}, {"submitted", now_text()}});
    write_json_file(out / "slurm" / "jobs.json", jobs);  // after each sbatch: a job id is never lost
    std::cout << "submitted job array " << id << ": " << indices.size() << " arm(s) (" << shape.nodes << " node(s) x "
              << shape.tasks_per_node << " task(s))\n";
  }
  std::cout << "follow with: ablate sweep --status " << out.string() << "; when every arm is done: ablate report " << out.string()
            << "\n";
  return 0;
}

int slurm_status(const fs::path& out) {
  const json order = read_json_file(out / "arms.json", kArmsJson);
  const json jobs = read_jobs(out);
  const std::set<std::string> ids = job_id_set(jobs);
  const std::map<std::string, std::string> in_queue = queued_tasks(ids);
  const std::map<std::string, std::string> accounted = accounted_tasks(ids);
  const std::map<std::size_t, std::string> latest = task_ids(jobs);
  std::map<std::string, std::size_t> counts;
  const auto names = order["arms"].get<std::vector<std::string>>();
  std::printf("%-28s %-14s %-9s %-12s %-9s %s\n", "arm", "state", "requeues", "step", "loss", "job");
  for (std::size_t i = 0; i < names.size(); ++i) {
    const fs::path dir = out / names[i];
    const auto arm = read_json_file_if_present(dir / "arm.json", kArmJson);
    const auto task = latest.find(i);
    const std::string job = task == latest.end() ? "-" : task->second;
    std::string state;
    if (task != latest.end() && in_queue.count(job) > 0 && active(in_queue.at(job))) state = in_queue.at(job);
    else if (arm && arm->value("status", "") != "running") state = arm->value("status", "");
    else if (task != latest.end() && in_queue.count(job) > 0) state = in_queue.at(job);
    else if (task != latest.end() && accounted.count(job) > 0) state = accounted.at(job);
    else if (arm) state = "interrupted";
    else state = task == latest.end() ? "not submitted" : "no record";
    for (char& c : state) c = char(std::tolower(static_cast<unsigned char>(c)));
    ++counts[state];
    const ArmProgress progress = read_progress(dir);
    char step[32], loss[32];
    std::snprintf(step, sizeof step, "%lld", (long long)progress.step);
    std::snprintf(loss, sizeof loss, "%.4f", progress.loss);
    const std::string requeues = arm ? std::to_string(arm->value("requeues", int64_t(0))) : "-";
    std::printf("%-28s %-14s %-9s %-12s %-9s %s\n", names[i].c_str(), state.c_str(), requeues.c_str(), progress.step < 0 ? "-" : step,
                std::isfinite(progress.loss) ? loss : "-", job.c_str());
  }
  std::string line;
  for (const auto& [state, n] : counts) line += (line.empty() ? "" : ", ") + std::to_string(n) + " " + state;
  std::cout << "arms: " << line << "\n";
  return 0;
}

}  // namespace sweep

// `ablate sweep-arm DIR K`: arm K of the sweep in DIR, as one Slurm array task runs it: resumes or
// starts it, under `srun` when it has several ranks, applies the early-stopping rule against the
// other arms' logs, and records arm.json. Exit 0 when the arm completed or was stopped early.
int cmd_sweep_arm(const Args& args) {
  po::options_description desc("ablate sweep-arm SWEEP_DIR INDEX");
  po::positional_options_description pos;
  desc.add_options()("dir", po::value<std::string>()->required(), "the sweep directory (holds plan.json)")(
      "index", int_option("index", 0, 9999)->required(), "the arm's index in plan.json (the array task id)");
  pos.add("dir", 1).add("index", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm, "ablate sweep-arm SWEEP_DIR INDEX   (the command a Slurm array task of a sweep runs)"))
    return 0;
  const fs::path out = vm["dir"].as<std::string>();
  Plan plan = read_plan(out);
  const auto index = std::size_t(vm["index"].as<int64_t>());
  if (index >= plan.arms.size()) {
    throw_input_error("index " + std::to_string(index),
                      "the sweep in " + out.string() + " has " + std::to_string(plan.arms.size()) + " arm(s)");
  }
  ArmPlan& p = plan.arms[index];
  decide_start(p);
  if (p.done) {
    std::cout << p.arm.name << ": already finished, nothing to do\n";
    return 0;
  }
  clear_for_restart(p);
  fs::create_directories(p.dir);
  json job = json::object();
  if (const char* id = std::getenv("SLURM_JOB_ID")) job["slurm_job_id"] = id;
  if (const char* n = std::getenv("SLURM_RESTART_COUNT")) job["requeues"] = std::strtoll(n, nullptr, 10);
  record_arm(p, "running", 0, 0, "", job);
  std::vector<std::string> prefix;
  if (p.arm.resources.ranks() > 1) {
    prefix = {"srun", "--mpi=" + plan.mpi, "--ntasks=" + std::to_string(p.arm.resources.ranks()), "--kill-on-bad-exit=1"};
  }
  ::signal(SIGTERM, on_term);     // scancel or the time limit: recorded, not lost
  ::signal(SIGUSR1, on_warning);  // --signal=B:USR1@N: passed on, the arm checkpoints and is requeued
  ArmRun r;
  r.start = std::chrono::steady_clock::now();
  r.pid = spawn_train(self_exe(), plan.base, p, prefix);
  std::cout << p.arm.name << ": training" << (p.resume ? " (resuming)" : "") << " on " << p.arm.resources.ranks() << " rank(s), log "
            << (p.dir / "train.log").string() << "\n"
            << std::flush;
  int status = 0;
  for (;;) {
    for (const std::string& e : poll_arm(r, p, plan.arms, plan.early_stop)) std::cout << e << "\n" << std::flush;
    const pid_t done = waitpid(r.pid, &status, WNOHANG);
    if (done == r.pid) break;
    if (done < 0 && errno != EINTR) throw_runtime_error("sweep-arm", std::string("waitpid: ") + std::strerror(errno));
    if (g_terminated == 1 && !r.stopping) {  // pass scancel's or the time limit's SIGTERM on, once
      ::kill(r.pid, SIGTERM);
      g_terminated = 2;
    }
    if (g_warned == 1) {  // pass the warning on, once
      ::kill(r.pid, SIGUSR1);
      g_warned = 2;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  poll_arm(r, p, plan.arms, EarlyStop{});
  auto [word, text] = finish_arm(r, p, status);
  if (g_terminated != 0 && word == "failed") {
    text = "cancelled or out of time (SIGTERM from Slurm) " + text;
    record_arm(p, "failed", 143, std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count(), text, job);
  }
  if (word == "preempted") {
    if (const std::string err = requeue_task(); !err.empty()) {
      record_arm(p, "failed", 75, std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count(),
                 text + "; not requeued: " + err, job);
      std::cout << p.arm.name << ": preempted and not requeued: " << err << "\n";
      return 1;
    }
    text += "; requeued";
  }
  std::cout << p.arm.name << ": " << word << ", " << text << "\n";
  return word == "failed" ? 1 : 0;
}

}  // namespace ablate::cli
