"""revnmt-prepare: tokenize and encode a run's corpora once, for every run that trains on them.

    revnmt-prepare --prepared DIR [revnmt-train's data options]

Writes DIR as ``revnmt-train --prepared DIR`` with the same data options reads it (memory-mapped token ids,
vocabularies, SentencePiece models, :mod:`revnmt.data.prepared`), as ``fairseq-preprocess`` does for
fairseq. A run given other corpora or text options prepares the folder anew; without ``--prepared`` a
run prepares its own, SAVE_DIR/data.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from revnmt.arguments import HelpFormatter, add_data_options, data_config
from revnmt.data import DataConfig, load_data, prepared_options, text_options
from revnmt.data.loading import input_files
from revnmt.data.prepared import check_preparable
from revnmt.training.interrupts import exit_on_signals

PROG = "revnmt-prepare"
USAGE_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    add_data_options(parser, test_set=False)
    args = parser.parse_args(argv)
    if not args.prepared:
        parser.error("--prepared DIR is required: the folder to prepare")
    config = data_config(parser, args)
    logging.basicConfig(level=logging.INFO, format=f"{PROG}: %(message)s", stream=sys.stderr)
    return exit_on_signals(PROG, lambda: _prepare(config, Path(args.prepared)))


def _prepare(config: DataConfig, folder: Path) -> int:
    log = logging.getLogger(PROG)
    try:
        config = config.resolved()
        check_preparable(folder, input_files(config))  # before any work: the folder is replaced whole
        fingerprint = config.fingerprint()
        options = prepared_options(config, fingerprint, folder)
        # Opening a prepared folder checks it: a damaged one is prepared anew.
        load_data(config, options or text_options(config), None, fingerprint, folder)
        if options is not None:
            log.info("%s holds these corpora prepared with these options already", folder)
    except (OSError, ValueError) as error:
        log.error("%s", error)
        return USAGE_ERROR
    return 0

if __name__ == "__main__":
    sys.exit(main())
