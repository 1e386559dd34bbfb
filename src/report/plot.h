// Line charts as hand-written SVG (no plotting library): axes, "nice" 1-2-5 ticks (decades on a log
// axis), grid, labels, polylines, optional point markers with text labels, and a legend. `loom plot DIR` uses it to draw a run's loss and
// learning-rate curves from DIR/metrics.jsonl.
#pragma once

#include <string>
#include <vector>

namespace loom::report {

struct Series {
  std::string label;
  std::string color = "#1f77b4";
  std::vector<double> x, y;  // same length; non-finite y values break the line
  bool markers = false;      // a dot at each point (for sparse series such as validation loss)
  bool line = true;          // false: markers only (a scatter)
  std::vector<std::string> point_labels;  // empty, or one text per point drawn beside its marker
  double stroke_width = 1.5;
};

struct Chart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Series> series;
  int width = 800;
  int height = 450;
  bool log_x = false, log_y = false;  // log10 axes (whole decades); points <= 0 are then left out
  bool legend_bottom_right = false;   // the legend's corner (default: top right)
};

// Ticks covering [lo, hi] with a step of 1, 2 or 5 times a power of ten, about `target` of them; all
// ticks lie within [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

// The chart as a standalone SVG document. Throws loom::Error if no series has a finite point.
std::string render_svg(const Chart& chart);

// Reads <run_dir>/metrics.jsonl and writes <out_dir>/loss.svg (train and validation loss against step)
// and <out_dir>/lr.svg (learning rate against step); out_dir defaults to run_dir. Runs whose train events
// carry expert_load_min/max (DeepSeek-V3) also get <out_dir>/expert_load.svg, and a main_loss field is
// drawn beside the loss. Returns the paths.
std::vector<std::string> plot_run(const std::string& run_dir, const std::string& out_dir = "");

// Several runs side by side (e.g. f32 against bf16 from the same seed): <out_dir>/compare_loss.svg
// (each run's train and validation loss) and <out_dir>/compare_loss_gap.svg (each later run's train
// loss minus the first run's, at the steps both logged). Returns the paths.
std::vector<std::string> plot_compare(const std::vector<std::string>& run_dirs, const std::string& out_dir);

}  // namespace loom::report
