"""PyFlink jobs. Each job module has a pure core (functions on records, unit-tested directly)
and a thin Flink wiring layer (``build``/``main``); ``submit`` runs a job on the stack's cluster."""
