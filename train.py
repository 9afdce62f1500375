#!/usr/bin/env python
"""Train an NMT model; see ``python train.py --help``. Running the same command again resumes."""

import sys

from revnmt.training import main

if __name__ == "__main__":
    sys.exit(main())
