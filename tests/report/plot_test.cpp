// SVG charts: tick choice, and a run's charts parsed back (points mapped into the plot area, in order).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>

#include "core/error.h"
#include "train/metrics.h"
#include "report/plot.h"
#include "support/files.h"

namespace fs = std::filesystem;
using loom::test::read_file;
using namespace loom::train;
using namespace loom::report;

namespace {

// The polylines' points, one vector of (x, y) per <polyline>.
std::vector<std::vector<std::pair<double, double>>> polylines(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> out;
  std::regex re("<polyline[^>]*points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    std::vector<std::pair<double, double>> pts;
    std::stringstream ss((*it)[1].str());
    std::string pair;
    while (ss >> pair) {
      auto comma = pair.find(',');
      pts.emplace_back(std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1)));
    }
    out.push_back(pts);
  }
  return out;
}

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(Plot, NiceTicksAreOneTwoFiveSteps) {
  EXPECT_EQ(nice_ticks(0, 1000, 5), (std::vector<double>{0, 200, 400, 600, 800, 1000}));
  EXPECT_EQ(nice_ticks(1.7, 7.3, 6), (std::vector<double>{2, 3, 4, 5, 6, 7}));
  auto t = nice_ticks(0, 0.002, 4);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_NEAR(t[1], 0.0005, 1e-12);
  EXPECT_EQ(nice_ticks(3, 3), (std::vector<double>{3}));
  auto neg = nice_ticks(-1, 1, 4);
  EXPECT_EQ(neg.front(), -1);
  EXPECT_EQ(neg[2], 0);
  EXPECT_FALSE(std::signbit(neg[2]));
}

TEST(Plot, RunChartsHaveOnePointPerEventInsideThePlotArea) {
  fs::path dir = fs::temp_directory_path() / ("loom_trainkit_plot_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    MetricsWriter w(dir.string());
    for (int s = 10; s <= 500; s += 10) {
      w.train({s, 2.0 + 6.0 * std::exp(-s / 100.0), s < 100 ? 1e-3 * s / 100 : 1e-3, 1, 1000, 0.01});
      if (s % 100 == 0) w.val({s, 2.2 + 6.0 * std::exp(-s / 100.0)});
    }
  }
  auto paths = plot_run(dir.string());
  ASSERT_EQ(paths.size(), 2u);
  std::string loss = read_file(dir / "loss.svg"), lr = read_file(dir / "lr.svg");
  ASSERT_EQ(loss.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(loss.find("</svg>"), std::string::npos);
  EXPECT_NE(loss.find(">train loss</text>"), std::string::npos);  // legend
  EXPECT_NE(loss.find(">val loss</text>"), std::string::npos);
  EXPECT_NE(loss.find(">step</text>"), std::string::npos);  // axis label
  EXPECT_NE(loss.find(">400</text>"), std::string::npos);   // an x tick
  EXPECT_EQ(count(loss, "<circle"), 5);                      // validation markers

  auto lines = polylines(loss);
  ASSERT_EQ(lines.size(), 2u);
  ASSERT_EQ(lines[0].size(), 50u);  // train
  ASSERT_EQ(lines[1].size(), 5u);   // val
  // Plot area: x in [70, 780], y in [40, 395] for the default 800x450 chart.
  for (const auto& line : lines) {
    for (auto [x, y] : line) {
      EXPECT_GE(x, 70 - 1e-6);
      EXPECT_LE(x, 780 + 1e-6);
      EXPECT_GE(y, 40 - 1e-6);
      EXPECT_LE(y, 395 + 1e-6);
    }
  }
  // Steps increase left to right; a falling loss rises in pixel y (SVG's y points down).
  for (size_t i = 1; i < lines[0].size(); ++i) {
    EXPECT_GT(lines[0][i].first, lines[0][i - 1].first);
    EXPECT_GT(lines[0][i].second, lines[0][i - 1].second);
  }
  // Step 500 is the right end of the x axis.
  EXPECT_NEAR(lines[0].back().first, 780, 1e-6);
  // The same x for train and val at step 100 (shared axis).
  EXPECT_NEAR(lines[0][9].first, lines[1][0].first, 1e-6);

  auto lr_lines = polylines(lr);
  ASSERT_EQ(lr_lines.size(), 1u);
  ASSERT_EQ(lr_lines[0].size(), 50u);
  EXPECT_NEAR(lr_lines[0][9].second, lr_lines[0][49].second, 1e-6);  // flat after warmup
  EXPECT_NEAR(lr_lines[0][9].second, 40 + 355 * 0.05 / 1.05, 0.5);  // max + 5% headroom at the top
  fs::remove_all(dir);
}

TEST(Plot, NonFiniteLossesBreakTheLineAndEmptyRunsAreErrors) {
  Chart c;
  c.title = "a < b & c";
  Series s;
  s.x = {1, 2, 3, 4, 5};
  s.y = {1, 2, NAN, 4, 5};
  c.series.push_back(s);
  std::string svg = render_svg(c);
  EXPECT_EQ(polylines(svg).size(), 2u);
  EXPECT_NE(svg.find("a &lt; b &amp; c"), std::string::npos);
  Chart empty;
  empty.series.push_back(Series{});
  EXPECT_THROW(render_svg(empty), loom::Error);
  fs::path dir = fs::temp_directory_path() / ("loom_trainkit_plot_empty_" + std::to_string(::getpid()));
  { MetricsWriter w(dir.string()); }
  EXPECT_THROW(plot_run(dir.string()), loom::Error);
  fs::remove_all(dir);
}

TEST(Plot, CompareDrawsEveryRunAndTheGapToTheFirst) {
  const fs::path root = fs::temp_directory_path() / ("loom_trainkit_plot_compare_" + std::to_string(::getpid()));
  fs::remove_all(root);
  // Run "a" logs steps 1..30, run "b" steps 1..20 (it stopped early), 0.01 * step above a.
  for (auto [name, steps, offset] : {std::tuple{"a", 30, 0.0}, std::tuple{"b", 20, 0.01}}) {
    MetricsWriter w((root / name).string());
    for (int s = 1; s <= steps; ++s) {
      w.train({s, 3.0 - 0.05 * s + offset * s, 1e-3, 1, 1000, 0.01});
      if (s % 10 == 0) w.val({s, 3.1 - 0.05 * s + offset * s});
    }
  }
  auto paths = plot_compare({(root / "a").string(), (root / "b").string()}, (root / "out").string());
  ASSERT_EQ(paths.size(), 2u);
  const std::string loss = read_file(root / "out" / "compare_loss.svg"), gap = read_file(root / "out" / "compare_loss_gap.svg");
  for (const char* label : {">a train</text>", ">a val</text>", ">b train</text>", ">b val</text>"}) {
    EXPECT_NE(loss.find(label), std::string::npos) << label;
  }
  auto lines = polylines(loss);
  ASSERT_EQ(lines.size(), 4u);  // a train, a val, b train, b val
  EXPECT_EQ(lines[0].size(), 30u);
  EXPECT_EQ(lines[1].size(), 3u);
  EXPECT_EQ(lines[2].size(), 20u);
  EXPECT_EQ(lines[3].size(), 2u);
  // The gap: b - a at the 20 steps both logged, growing with the step (SVG y grows downwards).
  EXPECT_NE(gap.find(">b - a</text>"), std::string::npos);
  auto g = polylines(gap);
  ASSERT_EQ(g.size(), 1u);
  ASSERT_EQ(g[0].size(), 20u);
  for (size_t i = 1; i < g[0].size(); ++i) {
    EXPECT_GT(g[0][i].first, g[0][i - 1].first);
    EXPECT_LT(g[0][i].second, g[0][i - 1].second);
  }
  // One run is not a comparison; no --out is an error too.
  EXPECT_THROW(plot_compare({(root / "a").string()}, (root / "out").string()), loom::Error);
  EXPECT_THROW(plot_compare({(root / "a").string(), (root / "b").string()}, ""), loom::Error);
  fs::remove_all(root);
}
