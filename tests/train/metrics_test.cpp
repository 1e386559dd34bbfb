// metrics.jsonl writing/reading and the console progress (bar and plain lines).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "core/error.h"
#include "train/metrics.h"
#include "train/progress.h"

namespace fs = std::filesystem;
using namespace loom::train;
using nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("loom_trainkit_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::vector<std::string> file_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// Captures what Progress writes to a FILE*.
struct Capture {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  std::string text() {
    std::fflush(f);
    return std::string(buf, size);
  }
  ~Capture() {
    std::fclose(f);
    std::free(buf);
  }
};

}  // namespace

TEST(Metrics, WritesOneFlushedObjectPerLine) {
  fs::path dir = temp_dir("metrics");
  {
    MetricsWriter w(dir.string());
    w.train({10, 3.25, 1e-3, 0.5, 12345.5, 0.0123});
    // Flushed per line: readable while the writer is still open.
    ASSERT_EQ(file_lines(dir / "metrics.jsonl").size(), 1u);
    w.val({10, 3.5});
    w.train({20, std::numeric_limits<double>::quiet_NaN(), 1e-3, std::numeric_limits<double>::infinity(), 1, 0});
    w.write({{"event", "skip"}, {"step", 21}});
  }
  auto events = read_metrics((dir / "metrics.jsonl").string());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0], (json{{"event", "train"}, {"step", 10}, {"loss", 3.25}, {"lr", 1e-3}, {"grad_norm", 0.5},
                             {"tokens_per_s", 12345.5}, {"mfu", 0.0123}}));
  EXPECT_EQ(events[1], (json{{"event", "val"}, {"step", 10}, {"val_loss", 3.5}}));
  EXPECT_TRUE(events[2]["loss"].is_null());  // JSON has no NaN
  EXPECT_TRUE(events[2]["grad_norm"].is_null());
  // A loss written and read back is the same double, bit for bit.
  {
    MetricsWriter w(dir.string());
    w.train({1, 0.1 + 0.2, 0, 0, 0, 0});
  }
  EXPECT_EQ(read_metrics((dir / "metrics.jsonl").string())[0]["loss"].get<double>(), 0.1 + 0.2);
  fs::remove_all(dir);
}

TEST(Metrics, ResumeKeepsEventsUpToTheCheckpointStep) {
  fs::path dir = temp_dir("resume");
  {
    MetricsWriter w(dir.string());
    for (int s = 10; s <= 50; s += 10) w.train({s, 1.0 * s, 0, 0, 0, 0});
    w.val({40, 2.0});
  }
  {
    MetricsWriter w(dir.string(), 30);  // resumed from the step-30 checkpoint
    w.train({40, 99, 0, 0, 0, 0});
  }
  auto events = read_metrics((dir / "metrics.jsonl").string());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2]["step"], 30);
  EXPECT_EQ(events[3]["loss"], 99);
  fs::remove_all(dir);
}

TEST(Metrics, ReadRejectsMalformedLinesButToleratesATruncatedLastLine) {
  fs::path dir = temp_dir("read");
  fs::create_directories(dir);
  std::ofstream(dir / "a.jsonl") << "{\"event\":\"train\",\"step\":1}\n\n{\"event\":\"val\",\"st";
  EXPECT_EQ(read_metrics((dir / "a.jsonl").string()).size(), 1u);
  std::ofstream(dir / "b.jsonl") << "{\"step\":1}\nnot json\n{\"step\":2}\n";
  try {
    read_metrics((dir / "b.jsonl").string());
    FAIL();
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_metrics((dir / "missing.jsonl").string()), loom::IoError);
  fs::remove_all(dir);
}

TEST(Metrics, MedianThroughputSkipsTheFirstInterval) {
  std::vector<json> ev = {{{"event", "train"}, {"tokens_per_s", 10}}, {{"event", "val"}, {"val_loss", 1}},
                          {{"event", "train"}, {"tokens_per_s", 300}}, {{"event", "train"}, {"tokens_per_s", 100}},
                          {{"event", "train"}, {"tokens_per_s", 200}}};
  EXPECT_EQ(median_tokens_per_s(ev), 200.0);
  EXPECT_FALSE(median_tokens_per_s({}).has_value());
}

TEST(Progress, DurationsAreHumanReadable) {
  EXPECT_EQ(format_duration(42.4), "42s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(-1), "?");
}

TEST(Progress, PlainLinesCarryTheFieldsAndAnEta) {
  Capture cap;
  double t = 100.0;
  Progress p(100, ProgressMode::Lines, cap.f, 0, [&] { return t; });
  EXPECT_FALSE(p.eta_seconds().has_value());
  t = 110.0;  // 10 steps in 10 s: 90 steps left -> 90 s
  p.update(10);
  ASSERT_TRUE(p.eta_seconds().has_value());
  EXPECT_DOUBLE_EQ(*p.eta_seconds(), 90.0);
  p.log({10, 3.14159, 2e-3, 0.75, 25300, 0.042});
  p.log_val({10, 3.5});
  p.finish();
  std::string out = cap.text();
  EXPECT_EQ(out,
            "step 10/100 | loss 3.1416 | lr 2.00e-03 | grad 0.750 | 25.3k tok/s | mfu 4.2% | eta 1m30s\n"
            "step 10/100 | val_loss 3.5000\n");
  EXPECT_EQ(out.find('\r'), std::string::npos);  // no terminal control codes in plain mode
}

TEST(Progress, BarRedrawsInPlaceAtMostTenTimesASecond) {
  Capture cap;
  double t = 0.0;
  Progress p(50, ProgressMode::Bar, cap.f, 10, [&] { return t; });  // resumed at step 10
  t = 1.0;
  p.update(11);  // first draw
  t = 1.05;
  p.update(12);  // too soon: no redraw
  std::string after_two = cap.text();
  EXPECT_EQ(std::count(after_two.begin(), after_two.end(), '\r'), 1);
  EXPECT_NE(after_two.find("step 11/50 ["), std::string::npos) << after_two;
  t = 2.0;  // 2 steps in 2 s since the resume: 38 left -> 38 s
  p.update(12);
  p.note("checkpoint saved");
  p.finish();
  std::string out = cap.text();
  EXPECT_NE(out.find("eta 38s"), std::string::npos) << out;
  EXPECT_NE(out.find("\r\x1b[Kcheckpoint saved\n"), std::string::npos) << out;  // the bar is cleared first
  EXPECT_EQ(out.back(), '\n');
  Capture none;
  Progress quiet(5, ProgressMode::None, none.f);
  quiet.update(1);
  quiet.log({1, 1, 1, 1, 1, 1});
  quiet.finish();
  EXPECT_EQ(none.text(), "");
}

TEST(Progress, AutoModeFollowsIsatty) {
  Capture cap;  // a memory stream is not a terminal
  EXPECT_EQ(progress_mode_from_name("auto", cap.f), ProgressMode::Lines);
  EXPECT_EQ(progress_mode_from_name("bar", cap.f), ProgressMode::Bar);
  EXPECT_THROW(progress_mode_from_name("fancy", cap.f), loom::Error);
}
