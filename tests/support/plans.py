"""Plan documents in tests: validated as the product reads them."""

from __future__ import annotations

from typing import Any

from ampe.formats.plan import plan_from_json


def validate_plan(doc: Any, source: str) -> dict[str, Any]:
    """Validate a parsed plan (:class:`~ampe.formats.plan.PlanFile`); InputError naming the first bad field. Returns
    the document unchanged."""
    plan_from_json(doc, source)
    return doc
