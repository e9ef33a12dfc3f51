"""Test doubles shared by the instrumentation tests."""


class FakeClock:
    """A monotonic nanosecond clock the test advances by hand."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def ms(self, millis: float) -> None:
        self.now += int(millis * 1_000_000)
