"""Test doubles and helpers shared by the instrumentation tests."""


class FakeClock:
    """A monotonic nanosecond clock the test advances by hand."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def ms(self, millis: float) -> None:
        self.now += int(millis * 1_000_000)


def metric_points(reader) -> dict[str, list]:
    """Every data point an SDK metric reader collects now, by metric name."""
    out: dict[str, list] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out
