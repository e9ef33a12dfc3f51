"""PyFlink jobs, one subpackage each (``normalize``, ``metrics``, ``archive``), all of one shape: ``core`` (pure
functions on records, unit-tested directly), ``functions`` (the Flink function classes, at module level so
Flink pickles them by reference) and ``job`` (``build``/``main``: ``python -m infersight.flink_jobs.<job>.job``).
``common`` holds what they share. The jobs import only ``infersight.schemas`` and third-party libraries;
submitting and stopping them is the local stack's work (``infersight.stack.jobs``)."""
