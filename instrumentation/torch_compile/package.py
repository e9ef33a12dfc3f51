"""The torch versions this adapter instruments (CompilationMetrics with recompile_reason, callback handler)."""

_instruments = ("torch >= 2.6, < 3",)
