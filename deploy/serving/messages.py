"""Errors in an HTTP client's words. The package's own messages speak to whoever converted it ("convert again with
a wider Dim") and name the plan's values ("%input_ids"); a client of a server can do neither, so it gets what it
sent wrong, or what failed on its values, and the replica's log keeps the full message for the operator."""
from __future__ import annotations

import re

# the advice to convert again, to the end of the message: the package's author's remedy, not the client's
CONVERT_AGAIN = re.compile(r"[.;] (?:The package was converted for|[Cc]onvert again)\b.*\Z", re.S)
# "aten::embedding failed (model source m.py:6  return ...): RuntimeError: " before the cause
STEP_PREFIX = re.compile(r"\A\S+ failed(?: \(model source .*?\))?: (?:\w+Error: )?", re.S)
PLAN_VALUE = re.compile(r"%([A-Za-z_][\w.]*)")


def refused(message: str) -> str:
    """A 400's message: what was wrong with the request, without the converter's remedy."""
    return CONVERT_AGAIN.sub("", message)


def failed(message: str, input_names: list[str]) -> str:
    """A 500's message when the model raised on the request's values: the cause, with the plan's values named as
    the client knows them (an input by its name, anything else as a value computed from the inputs)."""
    cause = STEP_PREFIX.sub("", message, count=1).replace("index out of range in self: ", "index out of range: ")

    def name(match: re.Match) -> str:
        value = match[1]
        return f"input '{value}'" if value in input_names else "a value the model computed from the inputs"

    return "the model failed on this request: " + PLAN_VALUE.sub(name, cause)
