"""Faults the IAM proxy injects on demand, per function and action, a given number of times.

- `error`: answer HTTP 500 before forwarding (the call did not happen).
- `timeout`: hold the request past the client's timeout, then answer 500 (the call did
  not happen; the SDK gave up on it first). The functions' DynamoDB client gives up after
  2.5 s, so the default hold is 3 s.
- `lost`: forward, then answer 500 instead of the real answer (the call landed; its
  answer was lost): the case a recovery read such as register's reload exists for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .model import JsonObject

KINDS = ("error", "timeout", "lost")


@dataclass
class Fault:
    function: str  # logical id, or * for any
    action: str  # e.g. dynamodb:UpdateItem; UpdateItem or * also match
    kind: str
    count: int
    hold_s: float = 3.0

    def matches(self, function: str, action: str) -> bool:
        short = action.split(":", 1)[-1]
        return self.function in ("*", function) and self.action in ("*", action, short)


class Faults:
    def __init__(self) -> None:
        self._armed: list[Fault] = []

    def arm(self, spec: JsonObject) -> Fault:
        kind = str(spec.get("kind", ""))
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        fault = Fault(
            function=str(spec.get("function", "*")),
            action=str(spec.get("action", "*")),
            kind=kind,
            count=int(spec.get("count", 1)),
            hold_s=float(spec.get("hold_s", 3.0)),
        )
        if fault.count < 1:
            raise ValueError("count must be at least 1")
        self._armed.append(fault)
        return fault

    def take(self, function: str, action: str) -> Fault | None:
        """The first armed fault for this call, used up by one."""
        for fault in self._armed:
            if fault.matches(function, action):
                fault.count -= 1
                if fault.count == 0:
                    self._armed.remove(fault)
                return fault
        return None

    def clear(self) -> None:
        self._armed.clear()

    def listed(self) -> list[JsonObject]:
        return [asdict(f) for f in self._armed]
