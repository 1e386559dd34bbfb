// The exit status of every `loom` command, one scheme (docs/guarantees.md):
//
//   0    success
//   1    error: the command could not do what was asked (a bad config value, a missing or malformed
//        file, a run directory loom must not write into, a non-finite loss, a filesystem error); the
//        message on stderr starts with "error: " and names the value or path
//   2    usage: the command line does not parse (unknown option, missing argument); CLI11's message
//   130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM: 128 + the signal, as a shell reports a process
//        killed by it. A training run stopped this way has saved its checkpoint and weights, and its
//        summary says "interrupted at step N"; a second signal ends the process at once with the same
//        status (train/stop_signal.h).
//
// A command's callback that must end with a status other than 0 after it has cleaned up throws
// ExitStatus; main.cpp returns its code.
#pragma once

namespace loom::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

// 128 + signal: 130 for SIGINT, 143 for SIGTERM.
inline constexpr int exit_status_for_signal(int signal) { return 128 + signal; }

struct ExitStatus {
  int code;
};

}  // namespace loom::cli
