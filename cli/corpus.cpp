// `loom corpus austen`: extracts the bundled training corpus (Jane Austen's novels) from Debian's
// r-cran-janeaustenr package into one plain-text file per novel. tools/get_corpus.sh fetches the package.
#include <cstdio>
#include <filesystem>
#include <string>

#include "cli/command.h"
#include "core/error.h"
#include "data/corpus.h"

namespace {
loom::cli::Register reg("corpus", "Extract the bundled training corpus as plain text", [](CLI::App& cmd) {
  cmd.require_subcommand(1);
  CLI::App* austen = cmd.add_subcommand("austen", "Jane Austen's six novels from r-cran-janeaustenr");
  // tools/get_corpus.sh keeps the package's data in data/janeaustenr; an installed package works too.
  auto rdata = std::make_shared<std::string>(
      std::filesystem::exists("data/janeaustenr/Rdata.rdb") ? "data/janeaustenr" : loom::data::kDebianAustenDataDir);
  auto out = std::make_shared<std::string>("data/austen");
  loom::cli::in_dir(austen->add_option("--rdata", *rdata,
                     "the package's data directory holding Rdata.rdb and Rdata.rdx "
                     "(tools/get_corpus.sh extracts it)"), "rdata")
      ->capture_default_str();
  loom::cli::out_dir(austen->add_option("--out", *out, "output directory"), "corpus")->capture_default_str();
  austen->callback([rdata, out] {
    if (!std::filesystem::exists(std::filesystem::path(*rdata) / "Rdata.rdb")) {
      throw loom::IoError(loom::str("corpus: no Rdata.rdb in ", *rdata,
                                    "; run tools/get_corpus.sh to download r-cran-janeaustenr"));
    }
    auto paths = loom::data::write_austen_corpus(*rdata, *out);
    for (const auto& p : paths) {
      std::printf("%s %lld bytes\n", p.c_str(), static_cast<long long>(std::filesystem::file_size(p)));
    }
  });
});
}  // namespace
