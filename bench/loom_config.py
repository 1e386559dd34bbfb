"""A loom preset or config file resolved in full, as `loom config` prints it. The presets in configs/ state
only what differs from their base (another preset, or loom's built-in defaults), so the comparison
scripts read a model through loom rather than from the file.

LOOM names the binary (default: build/loom beside this folder).
"""
import json
import os
import subprocess
import sys

LOOM = os.environ.get("LOOM", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "loom"))


def resolve(config):
    """The complete config of a preset name ("dsv3-mini") or a JSON file, as a dict; exits naming the problem."""
    if not os.access(LOOM, os.X_OK):
        sys.exit(f"{LOOM} is missing: cmake --build build --target loom (or set LOOM to the binary)")
    r = subprocess.run([LOOM, "config", "--config", config], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{LOOM} config --config {config}: {(r.stderr or r.stdout).strip()}")
    return json.loads(r.stdout)
