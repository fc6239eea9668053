"""The `zoo` command line: parse arguments, call the Python API, print.

``main`` (the app, --version, the run/plan/status/validate/schema/gc/kinds commands and the
error-to-exit-code mapping), ``zoo_commands`` (list/show/search/pull/push/tag/rm/fsck/remote),
``release_commands`` (repro/release/bundle), ``progress`` (a live run's display), ``tables`` (the
one way to print a table), ``formatting`` (numbers for people), ``jsonout`` (--json output and the
error object), ``completion`` (shell completion of names). The executable itself is `zoo.entry`
(the no-op fast path before any of this loads).
"""
