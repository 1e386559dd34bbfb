#include "train/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

namespace loom::train {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
std::atomic<int64_t> g_step{-1};
struct sigaction g_previous_int, g_previous_term;

static_assert(std::atomic<int64_t>::is_always_lock_free, "the signal handler reads the step lock-free");

// Only async-signal-safe calls from here on: write(2), _exit(2), and formatting by hand.
void write_stderr(const char* text, size_t n) {
  while (n > 0) {
    const ssize_t k = ::write(STDERR_FILENO, text, n);
    if (k <= 0) return;
    text += k;
    n -= static_cast<size_t>(k);
  }
}

void append(char* buf, size_t& len, size_t cap, const char* text) {
  while (*text && len + 1 < cap) buf[len++] = *text++;
}

extern "C" void on_stop_signal(int sig) {
  if (g_stop.exchange(true)) {
    // Second signal: give up on a clean stop.
    const char text[] = "\naborting: second interrupt, nothing more is saved\n";
    write_stderr(text, sizeof text - 1);
    ::_exit(128 + sig);
  }
  g_signal = sig;
  char buf[160];
  size_t len = 0;
  const int64_t step = g_step.load();
  append(buf, len, sizeof buf, "\nstopping after this step");
  if (step >= 0) {
    char digits[24];
    int n = 0;
    int64_t v = step;
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v > 0);
    append(buf, len, sizeof buf, " (step ");
    while (n > 0 && len + 1 < sizeof buf) buf[len++] = digits[--n];
    append(buf, len, sizeof buf, ")");
  }
  append(buf, len, sizeof buf, "; press Ctrl-C again to abort\n");
  write_stderr(buf, len);
}

}  // namespace

StopSignal::StopSignal() {
  g_stop = false;
  g_signal = 0;
  g_step = -1;
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
int StopSignal::signal() const { return g_signal.load(); }
void StopSignal::set_step(int64_t step) const { g_step = step; }

}  // namespace loom::train
