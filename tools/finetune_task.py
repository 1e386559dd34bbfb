#!/usr/bin/env python3
"""Writes a fine-tuning task SmolLM2-135M-Instruct lacks: sorting five numbers, as chat JSON Lines.

    python3 tools/finetune_task.py OUT_DIR [--train 800] [--test 100] [--seed 0]

OUT_DIR/train.jsonl and OUT_DIR/test.jsonl, each line
    {"messages": [{"role": "user", "content": "Sort in ascending order: 42, 7, 19, 88, 3"},
                  {"role": "assistant", "content": "3, 7, 19, 42, 88"}]}
The test lines are drawn apart from the training lines (no list appears in both). docs/finetune.md has the
commands that train on them and the exact-match accuracy before and after.
"""
import argparse
import json
import os
import random


def example(rng):
    nums = rng.sample(range(1, 100), 5)
    return nums, {"messages": [{"role": "user", "content": "Sort in ascending order: " + ", ".join(map(str, nums))},
                               {"role": "assistant", "content": ", ".join(map(str, sorted(nums)))}]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--train", type=int, default=800)
    p.add_argument("--test", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    seen = set()
    for name, n in (("test", a.test), ("train", a.train)):
        with open(os.path.join(a.out, name + ".jsonl"), "w") as f:
            written = 0
            while written < n:
                nums, ex = example(rng)
                if tuple(nums) in seen:
                    continue
                seen.add(tuple(nums))
                f.write(json.dumps(ex) + "\n")
                written += 1


if __name__ == "__main__":
    main()
