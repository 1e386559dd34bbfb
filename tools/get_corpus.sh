#!/usr/bin/env bash
# Fetches the default training corpus: Jane Austen's six novels, which Debian ships in the
# r-cran-janeaustenr package (an R data package; R itself is not needed). Downloads the .deb with
# apt-get download (no install, no root needed unless the apt lists must be refreshed), unpacks it with
# dpkg-deb -x, keeps its R data files in data/janeaustenr/, and extracts one UTF-8 text file per novel
# with `loom corpus austen`.
#
# usage: tools/get_corpus.sh [OUT_DIR (default data/austen)] [LOOM (default build/loom)]
# Does nothing when OUT_DIR already holds the six novels.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-data/austen}
loom=${2:-${LOOM:-build/loom}}

if [ "$(ls "$out"/*.txt 2>/dev/null | wc -l)" -ge 6 ]; then
  echo "corpus: $out already holds the novels"
  exit 0
fi
[ -x "$loom" ] || { echo "get_corpus: $loom not found; build loom first (tools/setup.sh)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
  cd "$work"
  if ! apt-get download r-cran-janeaustenr >/dev/null 2>&1; then
    # A fresh machine may have empty apt lists.
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    apt-get download r-cran-janeaustenr
  fi
  dpkg-deb -x r-cran-janeaustenr_*.deb pkg
)
# Keep the package's data files (1.6 MB) beside the text: the corpus tests read the real database from here.
rdata=data/janeaustenr
mkdir -p "$rdata"
cp "$work"/pkg/usr/lib/R/site-library/janeaustenr/data/Rdata.* "$rdata"/
"$loom" corpus austen --rdata "$rdata" --out "$out"
