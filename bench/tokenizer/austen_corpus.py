#!/usr/bin/env python3
"""Writes Jane Austen's six novels as one English text file, for the tokenizer benchmarks.

Source: Debian's r-cran-janeaustenr package (fetched with `apt-get download`, not installed, so no R is
needed). Its data/Rdata.rdb holds one record per object: a 4-byte big-endian (uncompressed) length, then
a zlib stream of an R serialization (XDR); each novel is a character vector, one element per line.

usage: austen_corpus.py OUT.txt [--bytes N]   (--bytes keeps only the first N bytes, at a line end)
"""
import argparse
import glob
import os
import struct
import subprocess
import sys
import tempfile
import zlib


def find_rdb(workdir):
    hits = glob.glob("/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb")
    if hits:
        return hits[0]
    subprocess.run(["apt-get", "download", "r-cran-janeaustenr"], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL)
    deb = glob.glob(os.path.join(workdir, "r-cran-janeaustenr_*.deb"))[0]
    subprocess.run(["dpkg-deb", "-x", deb, os.path.join(workdir, "x")], check=True)
    return glob.glob(os.path.join(workdir, "x/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"))[0]


def character_vector(blob):
    """The lines of an XDR-serialized R character vector (STRSXP of CHARSXPs)."""
    assert blob[:2] == b"X\n", "not an XDR serialization"
    pos = 2
    version, = struct.unpack(">i", blob[pos:pos + 4])
    pos += 12
    if version == 3:
        nelen, = struct.unpack(">i", blob[pos:pos + 4])
        pos += 4 + nelen
    flags, = struct.unpack(">i", blob[pos:pos + 4])
    if flags & 0xFF != 16:
        return None  # not a character vector
    n, = struct.unpack(">i", blob[pos + 4:pos + 8])
    pos += 8
    lines = []
    for _ in range(n):
        flags, length = struct.unpack(">ii", blob[pos:pos + 8])
        pos += 8
        assert flags & 0xFF == 9, "expected a CHARSXP"
        if length < 0:
            lines.append("")
            continue
        lines.append(blob[pos:pos + length].decode("utf-8", errors="replace"))
        pos += length
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--bytes", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = open(find_rdb(tmp), "rb").read()
    books, pos = [], 0
    while pos + 4 <= len(data):
        d = zlib.decompressobj()
        lines = character_vector(d.decompress(data[pos + 4:]))
        pos = len(data) - len(d.unused_data)
        if lines:
            books.append("\n".join(lines))
    text = "\n\n".join(books) + "\n"
    if args.bytes:
        cut = text.rfind("\n", 0, args.bytes)
        text = text[:cut + 1] if cut > 0 else text[:args.bytes]
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{args.out}: {len(books)} books, {len(text.encode())} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
