#!/usr/bin/env python
"""Train an NMT model: the same as ``revnmt-train`` (see ``--help``). Running the same command again resumes."""

import sys

from revnmt.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
