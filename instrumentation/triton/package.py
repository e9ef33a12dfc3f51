"""The tritonclient versions this adapter instruments (checked by ``BaseInstrumentor``)."""

_instruments = ("tritonclient >= 2.40.0, < 3",)
