"""Measuring tools that tests and benchmarks share: kernel launches (:mod:`.launches`), live tensor bytes by the
site that made them (:mod:`.live_bytes`), training tokens per second side by side (:mod:`.speed`). Nothing in the
library's own path imports them."""
