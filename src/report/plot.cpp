#include "report/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <utility>

#include "core/error.h"
#include "io/markup.h"
#include "train/metrics.h"

namespace loom::report {
using namespace loom::train;  // metrics events
namespace fs = std::filesystem;

namespace {

// A tick label with just enough digits for the tick step ("0.25", "1500", "3e-04").
std::string tick_label(double v, double step) {
  char buf[32];
  double a = std::fabs(v);
  if (a != 0 && (a < 1e-3 || a >= 1e6)) {
    std::snprintf(buf, sizeof(buf), "%.2g", v);
  } else {
    int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
    std::snprintf(buf, sizeof(buf), "%.*f", std::clamp(decimals, 0, 8), v);
  }
  return buf;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  LOOM_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, "nice_ticks: bad range [", lo, ", ", hi, "]");
  if (hi == lo) return {lo};
  double raw = (hi - lo) / std::max(target, 1);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) {
    double v = k * step;
    if (std::fabs(v) < step * 1e-9) v = 0;  // no "-0"
    ticks.push_back(v);
  }
  return ticks;
}

std::string render_svg(const Chart& chart) {
  const double W = chart.width, H = chart.height;
  const double left = 70, right = 20, top = 40, bottom = 55;
  const double pw = W - left - right, ph = H - top - bottom;
  // Coordinates are placed in axis space: log10 of the value on a log axis (NaN, so left out, for
  // values <= 0), the value itself otherwise.
  auto ax = [&](double x) { return !chart.log_x ? x : x > 0 ? std::log10(x) : std::numeric_limits<double>::quiet_NaN(); };
  auto ay = [&](double y) { return !chart.log_y ? y : y > 0 ? std::log10(y) : std::numeric_limits<double>::quiet_NaN(); };

  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : chart.series) {
    LOOM_CHECK(s.x.size() == s.y.size(), "plot: series '", s.label, "' has ", s.x.size(), " x values but ",
               s.y.size(), " y values");
    LOOM_CHECK(s.point_labels.empty() || s.point_labels.size() == s.x.size(), "plot: series '", s.label, "' has ",
               s.point_labels.size(), " point labels for ", s.x.size(), " points");
    for (size_t i = 0; i < s.x.size(); ++i) {
      const double x = ax(s.x[i]), y = ay(s.y[i]);
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  }
  LOOM_CHECK(std::isfinite(x0), "plot: chart '", chart.title, "' has no finite points",
             chart.log_x || chart.log_y ? " (a log axis leaves out values <= 0)" : "");
  // Non-negative data that comes near zero gets zero on the axis (steps from 0, a learning rate from 0),
  // so the eye reads proportions right. A log axis spans whole decades instead.
  if (chart.log_x) x0 = std::floor(x0), x1 = std::max(std::ceil(x1), x0 + 1);
  else if (x0 >= 0 && x0 < 0.25 * x1) x0 = 0;
  if (!chart.log_y && y0 >= 0 && y0 < 0.25 * y1) y0 = 0;
  if (x1 == x0) x1 = x0 + 1;
  if (chart.log_y) {
    y0 = std::floor(y0);
    y1 = std::max(std::ceil(y1), y0 + 1);
  } else if (y1 == y0) {
    double pad = y0 == 0 ? 1 : std::fabs(y0) * 0.1;
    y0 -= pad;
    y1 += pad;
  } else {
    double pad = (y1 - y0) * 0.05;
    y0 = (y0 >= 0 && y0 - pad < 0) ? 0 : y0 - pad;  // positive data (lr, loss) never gets a negative axis
    y1 += pad;
  }
  auto px = [&](double x) { return left + (ax(x) - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + (1 - (ay(y) - y0) / (y1 - y0)) * ph; };
  auto visible = [&](double x, double y) { return std::isfinite(ax(x)) && std::isfinite(ay(y)); };

  std::string svg;
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(chart.width) + "\" height=\"" +
         std::to_string(chart.height) + "\" viewBox=\"0 0 " + std::to_string(chart.width) + " " +
         std::to_string(chart.height) + "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text class=\"title\" x=\"" + fmt(left + pw / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">" +
         io::escape_markup(chart.title) + "</text>\n";

  // Grid and tick labels; ticks are values (px/py map them), one per decade on a log axis.
  auto decades = [](double lo, double hi) {
    std::vector<double> t;
    for (double k = lo; k <= hi + 1e-9; k += 1) t.push_back(std::pow(10.0, k));
    return t;
  };
  auto xt = chart.log_x ? decades(x0, x1) : nice_ticks(x0, x1, 8);
  auto yt = chart.log_y ? decades(y0, y1) : nice_ticks(y0, y1, 6);
  double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1, ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  auto label_x = [&](double v) { return chart.log_x ? tick_label(v, v) : tick_label(v, xstep); };
  auto label_y = [&](double v) { return chart.log_y ? tick_label(v, v) : tick_label(v, ystep); };
  svg += "<g class=\"grid\" stroke=\"#e0e0e0\" stroke-width=\"1\">\n";
  for (double v : xt) svg += "<line x1=\"" + fmt(px(v)) + "\" y1=\"" + fmt(top) + "\" x2=\"" + fmt(px(v)) + "\" y2=\"" + fmt(top + ph) + "\"/>\n";
  for (double v : yt) svg += "<line x1=\"" + fmt(left) + "\" y1=\"" + fmt(py(v)) + "\" x2=\"" + fmt(left + pw) + "\" y2=\"" + fmt(py(v)) + "\"/>\n";
  svg += "</g>\n<g class=\"xticks\" text-anchor=\"middle\">\n";
  for (double v : xt) {
    svg += "<line x1=\"" + fmt(px(v)) + "\" y1=\"" + fmt(top + ph) + "\" x2=\"" + fmt(px(v)) + "\" y2=\"" + fmt(top + ph + 5) + "\" stroke=\"black\"/>";
    svg += "<text x=\"" + fmt(px(v)) + "\" y=\"" + fmt(top + ph + 19) + "\">" + label_x(v) + "</text>\n";
  }
  svg += "</g>\n<g class=\"yticks\" text-anchor=\"end\">\n";
  for (double v : yt) {
    svg += "<line x1=\"" + fmt(left - 5) + "\" y1=\"" + fmt(py(v)) + "\" x2=\"" + fmt(left) + "\" y2=\"" + fmt(py(v)) + "\" stroke=\"black\"/>";
    svg += "<text x=\"" + fmt(left - 8) + "\" y=\"" + fmt(py(v) + 4) + "\">" + label_y(v) + "</text>\n";
  }
  svg += "</g>\n";
  // Axes and their labels.
  svg += "<g class=\"axes\" stroke=\"black\" stroke-width=\"1\"><line x1=\"" + fmt(left) + "\" y1=\"" + fmt(top + ph) +
         "\" x2=\"" + fmt(left + pw) + "\" y2=\"" + fmt(top + ph) + "\"/><line x1=\"" + fmt(left) + "\" y1=\"" + fmt(top) +
         "\" x2=\"" + fmt(left) + "\" y2=\"" + fmt(top + ph) + "\"/></g>\n";
  svg += "<text class=\"xlabel\" x=\"" + fmt(left + pw / 2) + "\" y=\"" + fmt(H - 12) + "\" text-anchor=\"middle\">" +
         io::escape_markup(chart.x_label) + "</text>\n";
  svg += "<text class=\"ylabel\" transform=\"translate(16 " + fmt(top + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
         io::escape_markup(chart.y_label) + "</text>\n";

  // The series: one polyline per finite run of points.
  for (const auto& s : chart.series) {
    svg += "<g class=\"series\" data-label=\"" + io::escape_markup(s.label) + "\">\n";
    std::string points;
    auto flush = [&] {
      if (!points.empty()) {
        svg += "<polyline fill=\"none\" stroke=\"" + s.color + "\" stroke-width=\"" + fmt(s.stroke_width) +
               "\" stroke-linejoin=\"round\" points=\"" + points + "\"/>\n";
      }
      points.clear();
    };
    for (size_t i = 0; i < s.x.size() && s.line; ++i) {
      if (!visible(s.x[i], s.y[i])) {
        flush();
        continue;
      }
      if (!points.empty()) points += ' ';
      points += fmt(px(s.x[i]));
      points += ',';
      points += fmt(py(s.y[i]));
    }
    flush();
    if (s.markers) {
      for (size_t i = 0; i < s.x.size(); ++i) {
        if (!visible(s.x[i], s.y[i])) continue;
        svg += "<circle cx=\"" + fmt(px(s.x[i])) + "\" cy=\"" + fmt(py(s.y[i])) + "\" r=\"3\" fill=\"" + s.color + "\"/>\n";
        if (!s.point_labels.empty() && !s.point_labels[i].empty()) {
          svg += "<text class=\"point-label\" x=\"" + fmt(px(s.x[i]) + 6) + "\" y=\"" + fmt(py(s.y[i]) - 5) +
                 "\" font-size=\"11\">" + io::escape_markup(s.point_labels[i]) + "</text>\n";
        }
      }
    }
    svg += "</g>\n";
  }

  // Legend, top right inside the plot.
  if (chart.series.size() > 1 || (!chart.series.empty() && !chart.series[0].label.empty())) {
    size_t longest = 0;  // the box grows with the longest label (~7 px a character at 12 px)
    for (const auto& s : chart.series) longest = std::max(longest, s.label.size());
    const double lw = std::max(140.0, 48.0 + 7.0 * static_cast<double>(longest));
    double lh = 20.0 * static_cast<double>(chart.series.size()) + 8;
    double lx = left + pw - lw - 10, ly = chart.legend_bottom_right ? top + ph - lh - 10 : top + 10;
    svg += "<g class=\"legend\"><rect x=\"" + fmt(lx) + "\" y=\"" + fmt(ly) + "\" width=\"" + fmt(lw) + "\" height=\"" + fmt(lh) +
           "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#999\"/>\n";
    for (size_t i = 0; i < chart.series.size(); ++i) {
      const auto& s = chart.series[i];
      double y = ly + 16 + 20.0 * static_cast<double>(i);
      svg += "<line x1=\"" + fmt(lx + 8) + "\" y1=\"" + fmt(y - 4) + "\" x2=\"" + fmt(lx + 32) + "\" y2=\"" + fmt(y - 4) +
             "\" stroke=\"" + s.color + "\" stroke-width=\"2\"/><text x=\"" + fmt(lx + 40) + "\" y=\"" + fmt(y) + "\">" +
             io::escape_markup(s.label) + "</text>\n";
    }
    svg += "</g>\n";
  }
  svg += "</svg>\n";
  return svg;
}

std::vector<std::string> plot_run(const std::string& run_dir, const std::string& out_dir_arg) {
  std::string metrics_path = (fs::path(run_dir) / "metrics.jsonl").string();
  auto events = read_metrics(metrics_path);
  auto num = [](const nlohmann::json& e, const char* key) {
    return e.contains(key) && e[key].is_number() ? e[key].get<double>() : std::numeric_limits<double>::quiet_NaN();
  };
  Series train, val, lr;
  train.label = "train loss";
  val.label = "val loss";
  val.color = "#ff7f0e";
  lr.label = "learning rate";
  lr.color = "#2ca02c";
  val.markers = true;
  val.stroke_width = 2;
  // Families that log more (DeepSeek-V3: main_loss beside the whole objective, per-MoE-layer expert
  // load shares) get their curves too.
  Series main_loss;
  main_loss.label = "train next-token loss";
  main_loss.color = "#9467bd";
  std::vector<Series> load_min, load_max;
  const char* palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  auto per_layer = [&](const nlohmann::json& e, const char* key, std::vector<Series>& out, const char* what,
                       double width, double step) {
    if (!e.contains(key) || !e[key].is_array()) return;
    for (size_t l = 0; l < e[key].size(); ++l) {
      if (out.size() <= l) {
        Series s;
        s.label = str("MoE layer ", l, " ", what);
        s.color = palette[l % 8];
        s.stroke_width = width;
        out.push_back(s);
      }
      out[l].x.push_back(step);
      out[l].y.push_back(e[key][l].is_number() ? 100.0 * e[key][l].get<double>()
                                               : std::numeric_limits<double>::quiet_NaN());
    }
  };
  for (const auto& e : events) {
    std::string kind = e.value("event", "");
    if (!e.contains("step") || !e["step"].is_number()) continue;
    double step = e["step"].get<double>();
    if (kind == "train") {
      train.x.push_back(step);
      train.y.push_back(num(e, "loss"));
      if (e.contains("main_loss")) {
        main_loss.x.push_back(step);
        main_loss.y.push_back(num(e, "main_loss"));
      }
      per_layer(e, "expert_load_max", load_max, "max", 2.0, step);
      per_layer(e, "expert_load_min", load_min, "min", 1.0, step);
      lr.x.push_back(step);
      lr.y.push_back(num(e, "lr"));
    } else if (kind == "val") {
      val.x.push_back(step);
      val.y.push_back(num(e, "val_loss"));
    }
  }
  LOOM_CHECK(!train.x.empty() || !val.x.empty(), "plot: ", metrics_path, " has no train or val events");
  fs::path out_dir = out_dir_arg.empty() ? fs::path(run_dir) : fs::path(out_dir_arg);
  fs::create_directories(out_dir);
  std::string name = fs::path(run_dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(run_dir).lexically_normal().parent_path().filename().string();

  std::vector<std::string> written;
  auto save = [&](const Chart& chart, const std::string& file) {
    fs::path p = out_dir / file;
    std::ofstream out(p);
    out << render_svg(chart);
    if (!out) throw IoError(str("plot: cannot write ", p.string()));
    written.push_back(p.string());
  };
  Chart loss;
  loss.title = "Loss: " + name;
  loss.x_label = "step";
  loss.y_label = "cross-entropy loss (nats/token)";
  if (!train.x.empty()) loss.series.push_back(train);
  if (!main_loss.x.empty()) loss.series.push_back(main_loss);
  if (!val.x.empty()) loss.series.push_back(val);
  save(loss, "loss.svg");
  if (!load_max.empty()) {
    Chart load;
    load.title = "Expert load (share of routed slots, least and most loaded expert): " + name;
    load.x_label = "step";
    load.y_label = "share of routed slots (%)";
    for (auto& s : load_max) load.series.push_back(s);
    for (auto& s : load_min) load.series.push_back(s);
    save(load, "expert_load.svg");
  }
  if (!lr.x.empty()) {
    Chart lr_chart;
    lr_chart.title = "Learning rate: " + name;
    lr_chart.x_label = "step";
    lr_chart.y_label = "learning rate";
    lr_chart.series.push_back(lr);
    save(lr_chart, "lr.svg");
  }
  return written;
}

std::vector<std::string> plot_compare(const std::vector<std::string>& run_dirs, const std::string& out_dir) {
  LOOM_CHECK(run_dirs.size() >= 2, "plot: comparing needs at least two run directories, got ", run_dirs.size());
  LOOM_CHECK(!out_dir.empty(), "plot: comparing runs needs --out (the charts belong to no one run)");
  const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  struct Curve {
    std::string name;
    std::map<double, double> train, val;  // step -> loss
  };
  std::vector<Curve> curves;
  for (const std::string& dir : run_dirs) {
    Curve c;
    c.name = fs::path(dir).lexically_normal().filename().string();
    if (c.name.empty()) c.name = fs::path(dir).lexically_normal().parent_path().filename().string();
    const std::string path = (fs::path(dir) / "metrics.jsonl").string();
    for (const auto& e : read_metrics(path)) {
      if (!e.contains("step") || !e["step"].is_number()) continue;
      const std::string kind = e.value("event", "");
      const char* key = kind == "train" ? "loss" : kind == "val" ? "val_loss" : nullptr;
      if (key == nullptr) continue;
      const double v = e.contains(key) && e[key].is_number() ? e[key].get<double>() : std::numeric_limits<double>::quiet_NaN();
      (kind == "train" ? c.train : c.val)[e["step"].get<double>()] = v;
    }
    LOOM_CHECK(!c.train.empty(), "plot: ", path, " has no train events to compare");
    curves.push_back(std::move(c));
  }
  Chart loss, gap;
  loss.title = "Loss";
  gap.title = str("Train loss minus ", curves[0].name, "'s, step by step");
  loss.x_label = gap.x_label = "step";
  loss.y_label = "cross-entropy loss (nats/token)";
  gap.y_label = "difference in loss (nats/token)";
  for (size_t i = 0; i < curves.size(); ++i) {
    Series t, v, d;
    t.label = curves[i].name + " train";
    v.label = curves[i].name + " val";
    t.color = v.color = d.color = palette[i % 8];
    t.stroke_width = 1.0;
    v.markers = true;
    v.stroke_width = 2.0;
    for (const auto& [step, value] : curves[i].train) {
      t.x.push_back(step);
      t.y.push_back(value);
      if (i == 0) continue;
      auto base = curves[0].train.find(step);  // steps the first run logged too
      if (base == curves[0].train.end()) continue;
      d.x.push_back(step);
      d.y.push_back(value - base->second);
    }
    for (const auto& [step, value] : curves[i].val) {
      v.x.push_back(step);
      v.y.push_back(value);
    }
    loss.series.push_back(t);
    if (!v.x.empty()) loss.series.push_back(v);
    if (i > 0) {
      d.label = curves[i].name + " - " + curves[0].name;
      gap.series.push_back(d);
    }
  }
  fs::create_directories(out_dir);
  std::vector<std::string> written;
  for (const auto& [chart, file] : {std::pair<const Chart*, const char*>{&loss, "compare_loss.svg"}, {&gap, "compare_loss_gap.svg"}}) {
    if (chart == &gap && std::none_of(gap.series.begin(), gap.series.end(), [](const Series& s) { return !s.x.empty(); })) {
      continue;  // no step in common
    }
    const fs::path p = fs::path(out_dir) / file;
    std::ofstream out(p);
    out << render_svg(*chart);
    if (!out) throw IoError(str("plot: cannot write ", p.string()));
    written.push_back(p.string());
  }
  return written;
}

}  // namespace loom::report
