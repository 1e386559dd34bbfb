// Ctrl-C (SIGINT) and SIGTERM as a request to stop training cleanly after the current step.
//
// A signal handler can only touch a process-wide flag, so this is the one piece of global state in
// the trainer, wrapped in an RAII guard: while a StopSignal lives, the first signal sets the flag
// (the loop finishes its step, saves, and returns); a second one restores the default action, so a
// stuck process can still be interrupted.
#pragma once

namespace loom::train {

class StopSignal {
 public:
  StopSignal();   // installs the handlers
  ~StopSignal();  // restores the previous ones
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  bool requested() const;
  void request();  // as if a signal arrived (tests)
};

}  // namespace loom::train
