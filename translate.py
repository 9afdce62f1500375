#!/usr/bin/env python
"""Translate raw text with a trained checkpoint: the same as ``revnmt-translate`` (see ``--help``)."""

import sys

from revnmt.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
