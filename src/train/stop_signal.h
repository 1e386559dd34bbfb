// Ctrl-C (SIGINT) and SIGTERM as a request to stop training cleanly.
//
// A signal handler can only touch process-wide state, so this is the one piece of global state in
// the trainer, wrapped in an RAII guard: while a StopSignal lives, the first signal sets the flag and
// says so at once on stderr ("stopping after this step (step N); press Ctrl-C again to abort"); the
// training loop looks at the flag between micro-batches and between validation batches, so it stops
// within one micro-batch or one validation batch, at the last completed step, and saves. A second
// signal ends the process at once with status 128 + the signal (130 for SIGINT, 143 for SIGTERM), the
// status an interrupted `loom` command exits with either way (cli/exit_codes.h).
#pragma once

#include <cstdint>

namespace loom::train {

class StopSignal {
 public:
  StopSignal();   // installs the handlers
  ~StopSignal();  // restores the previous ones
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  bool requested() const;
  void request();  // as if a signal arrived (tests); signal() stays 0
  // The signal that asked to stop (SIGINT or SIGTERM); 0 when none did.
  int signal() const;
  // The step the process is working on, for the first signal's message; -1 for none. The training loop
  // sets it (const: it is the handler's shared state, not this object's).
  void set_step(int64_t step) const;
};

}  // namespace loom::train
