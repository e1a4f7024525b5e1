"""An environment for examples/no_service.sop: a phone and its line (docs/tutorial-environment.md).

`sop run examples/no_service.sop --cases cases.jsonl --model agent=tools:... --env python:examples.no_service_env:make`

The phone has airplane mode, a SIM that the network sees or not, and network settings that may be
stale; the line may be suspended or under an outage. Service is back when nothing blocks it: the line
is active, there is no outage, the SIM is seen, airplane mode is off and the stale settings have been
replaced — fresh settings for the network the phone is on, then a restart, as many times as the fault
needs. Pushing settings for the wrong network, or restarting without fresh settings, changes nothing.

The factory reads the case's story (its system values, the looks of `ServiceRestored` included) to set
the hidden faults, so an agent that follows the procedure sees exactly the case's looks; an agent that
does something else sees what the phone would really do.
"""

from __future__ import annotations

from typing import Any

MAX_RESTARTS = 3  # more fix cycles than the procedure's `up to 2 times`: a fault the fixes never clear


class Phone:
    """The world of one no-service call: the line, the phone, and what the agent has done to them."""

    def __init__(self, system: dict[str, Any]) -> None:
        self.suspended = bool(system.get("AccountSuspended"))
        self.outage = bool(system.get("AreaOutage"))
        self.outage_hours = int(system.get("OutageHours") or 0)
        self.airplane = bool(system.get("AirplaneMode"))
        self.sim_detected = bool(system.get("SimDetected", True))
        self.sim_age = int(system.get("SimAgeYears") or 0)
        self.network = str(system.get("Registered") or "Home")
        looks = system.get("ServiceRestored")
        looks = list(looks) if isinstance(looks, list) else [bool(looks)]
        self.airplane_blocks, self.stale_fixes = _faults(looks, self.airplane)
        self.sim_blocks = not self.sim_detected and looks[:1] != [True]  # a SIM the network does not see
        self.fresh_settings = False  # fresh settings for the right network pushed, not yet restarted
        self.done: list[str] = []  # what the agent told or booked for the caller, in order
        self.sim_fee: int | None = None
        self.transferred = False

    # -- what the agent can look up ------------------------------------------------------------
    def observe(self, name: str) -> Any:
        values = {
            "AccountSuspended": self.suspended, "AreaOutage": self.outage, "OutageHours": self.outage_hours,
            "AirplaneMode": self.airplane, "SimDetected": self.sim_detected, "SimAgeYears": self.sim_age,
            "Registered": self.network, "ServiceRestored": self.service(),
        }
        return values[name]

    def service(self) -> bool:
        if self.suspended or self.outage:
            return False
        if self.sim_blocks or (self.airplane and self.airplane_blocks):
            return False
        return self.stale_fixes == 0

    # -- the SOP's actions ---------------------------------------------------------------------
    def AskAirplaneOff(self) -> None:
        self.airplane = False
        self.done.append("airplane off")

    def PushSettings(self, profile: str) -> None:
        if profile == self.network:
            self.fresh_settings = True
        self.done.append(f"settings {profile}")

    def AskRestart(self) -> None:
        if self.fresh_settings and self.stale_fixes > 0:
            self.stale_fixes -= 1
        self.fresh_settings = False
        self.done.append("restart")

    def ExplainPayment(self) -> None:
        self.done.append("payment explained")

    def ReportOutage(self, hours: int) -> None:
        self.done.append(f"outage reported ({hours} h)")

    def ReplaceSim(self, fee: int) -> None:
        self.sim_fee = fee
        self.done.append(f"SIM booked ({fee} EUR)")

    def TransHuman(self) -> None:
        self.transferred = True
        self.done.append("transferred")

    def CloseFixed(self) -> None:
        self.done.append("closed as fixed")

    # -- what the end-state check compares ---------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"airplane": self.airplane, "fresh_settings": self.fresh_settings, "stale_fixes": self.stale_fixes,
                "service": self.service(), "sim_fee": self.sim_fee, "transferred": self.transferred,
                "done": list(self.done)}


def _faults(looks: list[Any], airplane: bool) -> tuple[bool, int]:
    """(airplane mode blocks service, fix cycles the stale settings need) from the case's looks as the
    procedure takes them: the first look, one after switching airplane mode off (when it is on), then one
    after each fix cycle."""
    if not looks or looks[0] is True:
        return False, 0  # service is there at the first look: nothing blocks it
    first_true = next((i for i, v in enumerate(looks) if v is True), None)
    if airplane:
        if first_true == 1:
            return True, 0  # airplane mode was all
        return True, MAX_RESTARTS if first_true is None else first_true - 1
    return False, MAX_RESTARTS if first_true is None else first_true


def make(system: dict[str, Any], seed: int) -> Phone:
    """The environment factory (`--env python:examples.no_service_env:make`)."""
    del seed  # the phone is deterministic: everything comes from the case
    return Phone(system)
