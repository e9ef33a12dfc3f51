"""A fake keyed Flink runtime for driving the jobs' Flink functions without a cluster: state per key (copies, as a
state backend keeps), event- and processing-time timers fired in time order, counters. One ``Runtime`` stands for
one (keyed) operator: its RuntimeContext, its Context and TimerService."""

from __future__ import annotations

import pickle


class Counter:
    """A Flink metric counter: ``n`` is what was counted."""

    def __init__(self):
        self.n = 0

    def inc(self, n=1):
        self.n += n


class _Value:
    def __init__(self, runtime, name):
        self.runtime, self.name = runtime, name

    def value(self):
        return self.runtime.scope().get(self.name)

    def update(self, v):
        self.runtime.scope()[self.name] = pickle.loads(pickle.dumps(v))  # a copy, as a state backend keeps

    def clear(self):
        self.runtime.scope().pop(self.name, None)


class _List(_Value):
    def add(self, v):
        self.runtime.scope().setdefault(self.name, []).append(pickle.loads(pickle.dumps(v)))

    def get(self):
        return list(self.runtime.scope().get(self.name, []))


class Runtime:
    """One (keyed) operator: its RuntimeContext, its Context and TimerService, and its timers' firing."""

    def __init__(self, fn, key_of=None):
        self.fn, self.key_of = fn, key_of
        self.store, self.key, self.timers, self.counters = {}, None, set(), {}
        self.watermark, self.now = -(2**63), 0
        fn.open(self)

    # RuntimeContext
    def get_state(self, descriptor):
        return _Value(self, descriptor.name)

    def get_list_state(self, descriptor):
        return _List(self, descriptor.name)

    def get_metrics_group(self):
        return self

    def counter(self, name):
        return self.counters.setdefault(name, Counter())

    # Context, TimerService
    def timer_service(self):
        return self

    def current_watermark(self):
        return self.watermark

    def current_processing_time(self):
        return self.now

    def register_event_time_timer(self, t):
        self.timers.add(("event", t, self.key))

    def register_processing_time_timer(self, t):
        self.timers.add(("proc", t, self.key))

    def delete_processing_time_timer(self, t):
        self.timers.discard(("proc", t, self.key))

    def get_current_key(self):
        return self.key

    def scope(self):
        return self.store.setdefault(self.key, {})

    def send(self, value):
        self.key = self.key_of(value) if self.key_of else None
        return list(self.fn.process_element(value, self) or ())

    def advance(self, watermark=None, now=None):
        """Moves event or processing time on and fires the due timers, in time order (Flink's rule: an event-time
        timer fires once the watermark reaches it)."""
        if watermark is not None:
            self.watermark = max(self.watermark, watermark)
        if now is not None:
            self.now = max(self.now, now)
        out = []
        while True:
            due = sorted(t for t in self.timers
                         if t[1] <= (self.watermark if t[0] == "event" else self.now))
            if not due:
                return out
            self.timers.discard(due[0])
            self.key = due[0][2]
            out += list(self.fn.on_timer(due[0][1], self) or ())
