"""The console commands: ``revnmt-train`` (:mod:`.train`), ``revnmt-translate`` (:mod:`.translate`) and
``revnmt-memory`` (:mod:`.memory`). Each module parses its command line into typed configs and calls the
library; nothing in the library imports from here."""
