#include "train/stop_signal.h"

#include <atomic>
#include <csignal>

namespace loom::train {
namespace {

std::atomic<bool> g_stop{false};
struct sigaction g_previous_int, g_previous_term;

extern "C" void on_stop_signal(int sig) {
  if (g_stop.exchange(true)) {
    // Second signal: give up on a clean stop.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

}  // namespace

StopSignal::StopSignal() {
  g_stop = false;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGTERM, &action, &g_previous_term);
}

StopSignal::~StopSignal() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
}

bool StopSignal::requested() const { return g_stop.load(); }
void StopSignal::request() { g_stop = true; }

}  // namespace loom::train
