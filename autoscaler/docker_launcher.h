// DockerLauncher: runs each worker as a unit of a container engine (see
// container_engine.h): a container through a Docker Engine (--launcher
// docker), or a service of one replica on a Docker Swarm (--launcher
// swarm). The engine decides what a unit is; this class is the loop's side,
// the same for both.
//
// Units come from one fixed template: the configured image running
//   /bin/sh -c 'exec fleet-worker --id ID WORKER_ARGS'
// under docker-init, never privileged, all capabilities dropped,
// no-new-privileges (containers; the swarm API of Docker 20.10 cannot set
// it on services), read-only root (a small tmpfs on /tmp), memory and pids
// limits, never restarted by the engine (restart policy "no", or a
// service's restart condition "none": the autoscaler replaces workers, the
// engine must not resurrect retired ones), no binds but the checked,
// read-only, non-recursive --docker-mount ones (see docker_mount.h), and the
// labels
//   fleet.pool=POOL fleet.role=worker fleet.worker-id=ID
//   fleet.metrics-port=PORT (when the worker serves /metrics)
// which Prometheus' docker_sd_configs (dockerswarm_sd_configs) and this
// launcher select on. The launcher never touches a unit without its pool
// label.
//
// Every engine call after the constructor's checks runs off the loop, on
// the launcher's own engine thread, in the order the loop queued them (a
// busy engine takes 5-10 s for a create and start; the loop must not wait
// for it). The loop side only queues calls and applies their results in
// Poll:
//  - Start books the worker and queues its create (and start); it returns
//    at once (accepted). A failed create or start comes back from a later
//    Poll as an exit with its error, which the pool book counts as a start
//    failure.
//  - Each Poll applies what the engine thread finished, then queues one
//    list of the pool's units (never more than one outstanding). A list
//    shows an exited unit: its exit code is read and it is removed
//    (queued; reported as an exit once done); a running one it does not
//    know (left by an earlier autoscaler run) is adopted (TakeAdopted); an
//    exited or never-started one it does not know is removed.
//  - Stop gives the worker its grace to drain and leave by itself, then
//    Poll queues SIGTERM, then SIGKILL after the grace again, as the process
//    launcher does (a worker whose start is still running is signalled once
//    its unit exists), and SIGKILL again every max(grace, 5 s) while its
//    unit is still listed (a kill the engine failed to carry out).
// One thread and first in, first out, so a list always reflects every start
// and removal queued before it: a unit this launcher created is never taken
// for one removed behind its back, nor for one to adopt. Rejected: a thread
// per call (unbounded threads, and lists racing the creates they must see).
//
// Thread-safety: the public methods are for one thread (the loop); the
// engine threads share only the mutex-guarded queues. StopAll blocks about
// 2 x grace, plus a few API timeouts when an engine does not answer
// (shutdown).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "autoscaler/container_engine.h"
#include "autoscaler/launcher.h"

namespace fleet::autoscaler {

class DockerLauncher : public Launcher {
 public:
  // The Docker launcher over one engine: a DockerEngine from `options`
  // (the mounts are checked first, std::invalid_argument; then that the
  // engine answers, speaks API >= 1.41, has the image and (when named) the
  // network; std::runtime_error saying what is wrong and what to do). Then
  // starts the engine thread.
  explicit DockerLauncher(DockerOptions options);
  // The same loop over another engine (SwarmEngine: --launcher swarm).
  explicit DockerLauncher(std::unique_ptr<ContainerEngine> engine);
  // Several engines (--docker-engine, repeatable), each with its own engine
  // thread: a start goes to the answering engine with the fewest workers
  // (the first of those on a tie); an engine whose list or create gets no
  // answer is skipped until a list answers again; one that answers but
  // refuses creates gets no starts for 1 s, doubling to 60 s while its
  // creates keep failing (unless every engine is in that state); the
  // workers of an engine that does not answer when they are to be killed
  // are counted gone (and adopted if it comes back with them running). Each engine is checked as above;
  // one that does not answer now is only skipped (checked again before its
  // next list) unless none answers: then, or on any other finding (no
  // image, no network), this throws.
  explicit DockerLauncher(std::vector<std::unique_ptr<ContainerEngine>> engines);
  // Finishes the engine calls already queued (each bounded by api_timeout),
  // then stops the engine threads. Leaves the units running: a restarted
  // autoscaler adopts them.
  ~DockerLauncher() override;
  DockerLauncher(const DockerLauncher&) = delete;
  DockerLauncher& operator=(const DockerLauncher&) = delete;

  const char* name() const override { return lanes_.front()->engine->kind(); }
  // Never waits for the engine: false for an id already known, or when no
  // engine answers.
  bool Start(const std::string& id, TimePoint now, std::string* error) override;
  void Stop(const std::string& id, Duration grace, TimePoint now) override;
  void CancelStop(const std::string& id) override;
  // Never waits for the engine (see above).
  std::vector<Exited> Poll(TimePoint now) override;
  std::vector<std::string> TakeAdopted() override;
  // Started (its start in progress included) and not reported exited.
  std::vector<std::string> Alive() const override;
  void StopAll(Duration grace) override;

  // Waits until the engine threads have done every call queued so far
  // (their results wait for the next Poll). False if that took longer than
  // `timeout`. For tests and StopAll; the loop never waits.
  bool WaitIdle(std::chrono::milliseconds timeout);

  // The container (or service) name for worker `id` ("POOL-ID").
  std::string ContainerName(const std::string& id) const {
    return lanes_.front()->engine->UnitName(id);
  }
  // The JSON body of the create call for worker `id` (for tests and logs).
  std::string CreateBody(const std::string& id) const {
    return lanes_.front()->engine->CreateBody(id);
  }
  // How many workers each engine runs, in the order given (for tests).
  std::vector<std::size_t> WorkersPerEngine() const;

 private:
  struct Worker {
    std::size_t lane = 0;   // which engine runs it
    std::string container;  // the unit's engine id; empty while its start runs
    bool reaping = false;   // seen exited: exit code and removal queued
    std::optional<TimePoint> term_at;
    std::optional<TimePoint> kill_at;
    Duration grace{};
    bool termed = false;
    bool killed = false;  // SIGKILL sent (a swarm service is then removed)
    std::string note;     // why it is not running yet, as last logged
  };
  using Listed = ContainerEngine::Unit;
  // One call for an engine thread, and what came of it.
  enum class Op { kStart, kList, kReap, kSignal, kRemove };
  struct EngineCall {
    Op op;
    std::string id;         // worker id (start, reap, signal)
    std::string container;  // reap, signal, remove
    std::string arg;        // start: the create body; signal: its name; remove: what, for logs
    Duration grace{};       // signal: the worker's grace (the swarm's stop grace period)
  };
  struct EngineResult {
    Op op;
    std::string id;
    std::string container;  // start: the new container
    std::string error;      // start, reap: why it never ran; list: why there is no list
    int exit_code = -1;     // reap
    std::optional<std::vector<Listed>> listed;  // list
    bool unreachable = false;  // start, list: the engine did not answer at all
  };
  // One engine, its thread and its queues.
  struct Lane {
    std::unique_ptr<ContainerEngine> engine;
    // The loop's.
    bool list_queued = false;  // a list is queued or running
    bool failing = false;      // its last list (or a create) got no answer: no starts
    std::string last_error;    // of its last failed list, as logged
    int bad_starts = 0;        // creates refused in a row
    TimePoint starts_resume_at{};  // after refused creates, others get the starts until then
    // Shared with its thread under mu_.
    bool checked = false;  // its constructor checks passed (else redone before a list)
    std::deque<EngineCall> calls;
    std::deque<EngineResult> results;
    bool busy = false;  // the thread is running a call
    std::thread thread;
  };

  // An engine thread's side.
  void EngineLoop(Lane* lane);
  EngineResult Execute(Lane* lane, const EngineCall& call);

  // The loop's side.
  void Queue(std::size_t lane, EngineCall call);
  void Apply(std::size_t lane, EngineResult result, TimePoint now, std::vector<Exited>* exited);
  void ApplyList(std::size_t lane, const std::vector<Listed>& listed,
                 std::vector<Exited>* exited);
  const ContainerEngine& engine() const { return *lanes_.front()->engine; }

  std::vector<std::unique_ptr<Lane>> lanes_;  // fixed after the constructor
  std::map<std::string, Worker> workers_;     // by worker id
  std::vector<std::string> adopted_;          // since the last TakeAdopted

  // Shared with the engine threads.
  std::mutex mu_;
  std::condition_variable work_cv_;  // calls queued, or stopping
  std::condition_variable idle_cv_;  // a call finished
  bool stop_ = false;
  std::chrono::steady_clock::time_point stop_deadline_{};  // set with stop_
};

}  // namespace fleet::autoscaler
